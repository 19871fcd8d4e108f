/*
 * kvf matrix: runs kvf-matrix (tools/kvf-matrix, installed next to
 * this binary), which drives kvf xfer-test, kvf-up/kvf-down pools and kvf
 * generate per cell and prints the table. Like git's external commands: the
 * orchestration is a script, the checks it runs are this binary's.
 */
#include "kvf_cmds.h"
#include "kvf_log.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int kvf_cmd_matrix(int argc, char **argv)
{
    char self[PATH_MAX], script[PATH_MAX + 16], interp[] = "python3";
    char **args;
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    char *slash;

    if (n <= 0) {
        kvf_error("kvf matrix: cannot find this binary's folder: %m");
        return 1;
    }
    self[n] = '\0';
    slash = strrchr(self, '/');
    if (slash != NULL) {
        *slash = '\0';
    }
    snprintf(script, sizeof(script), "%s/kvf-matrix", self);
    args = calloc((size_t)argc + 3, sizeof(char *));
    if (args == NULL) {
        return 1;
    }
    args[0] = interp;
    args[1] = script;
    for (int i = 0; i < argc; ++i) {
        args[i + 2] = argv[i];
    }
    execvp("python3", args);
    kvf_error("kvf matrix: cannot run python3 %s: %m", script);
    free(args);
    return 1;
}
