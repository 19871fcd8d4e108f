/*
 * Corpus replayer: the main() of every fuzz target outside the libFuzzer
 * build (gcc, ASan+UBSan or plain). Runs LLVMFuzzerTestOneInput once per
 * file named on the command line, or per file inside a named folder, so
 * ctest replays the committed seeds and regression inputs of each target
 * on every build (tests/fuzz/CMakeLists.txt). A crash or abort fails the
 * test; no input at all fails it too (an empty corpus tests nothing).
 *
 *   fuzz_handshake tests/fuzz/corpus/fuzz_handshake [more files or folders]
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv) __attribute__((weak));

static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    uint8_t *buf;
    long n;

    if (f == NULL) {
        fprintf(stderr, "fuzz replay: cannot open %s\n", path);
        return -1;
    }
    if ((fseek(f, 0, SEEK_END) != 0) || ((n = ftell(f)) < 0) || (fseek(f, 0, SEEK_SET) != 0)) {
        fclose(f);
        fprintf(stderr, "fuzz replay: cannot size %s\n", path);
        return -1;
    }
    /* an exact-size heap copy, so ASan sees a read one byte past the input */
    buf = malloc((size_t)n ? (size_t)n : 1);
    if ((buf == NULL) || (fread(buf, 1, (size_t)n, f) != (size_t)n)) {
        fclose(f);
        free(buf);
        fprintf(stderr, "fuzz replay: cannot read %s\n", path);
        return -1;
    }
    fclose(f);
    (void)LLVMFuzzerTestOneInput(buf, (size_t)n);
    free(buf);
    return 0;
}

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Files of @a dir in name order (a stable replay order). @return inputs run, -1 on error. */
static int run_dir(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    char **names = NULL;
    size_t num = 0, cap = 0;
    int ran = 0;

    if (d == NULL) {
        fprintf(stderr, "fuzz replay: cannot open folder %s\n", dir);
        return -1;
    }
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') {
            continue;
        }
        if (num == cap) {
            cap = cap ? 2 * cap : 64;
            char **n = realloc(names, cap * sizeof(*n));
            if (n == NULL) {
                break;
            }
            names = n;
        }
        names[num] = malloc(strlen(dir) + strlen(e->d_name) + 2);
        if (names[num] == NULL) {
            break;
        }
        sprintf(names[num], "%s/%s", dir, e->d_name);
        num++;
    }
    closedir(d);
    qsort(names, num, sizeof(*names), cmp_names);
    for (size_t i = 0; i < num; ++i) {
        struct stat st;
        if ((ran >= 0) && (stat(names[i], &st) == 0) && S_ISREG(st.st_mode)) {
            ran = (run_file(names[i]) == 0) ? ran + 1 : -1;
        }
        free(names[i]);
    }
    free(names);
    return ran;
}

int main(int argc, char **argv)
{
    int total = 0;

    if (LLVMFuzzerInitialize != NULL) {
        LLVMFuzzerInitialize(&argc, &argv);
    }
    for (int i = 1; i < argc; ++i) {
        struct stat st;
        int n;
        if (stat(argv[i], &st) != 0) {
            fprintf(stderr, "fuzz replay: %s does not exist\n", argv[i]);
            return 1;
        }
        n = S_ISDIR(st.st_mode) ? run_dir(argv[i]) : ((run_file(argv[i]) == 0) ? 1 : -1);
        if (n < 0) {
            return 1;
        }
        total += n;
    }
    if (total == 0) {
        fprintf(stderr, "fuzz replay: no input to run (an empty corpus tests nothing)\n");
        return 1;
    }
    printf("%s: %d inputs replayed, none crashed\n", argv[0], total);
    return 0;
}
