/*
 * kvf bench-serve: the percentile plot (PNG through gnuplot). Two panels,
 * TTFT and ITL; x is the request rate of each run (categorical ticks, so
 * "inf" and a single run plot as well), one line per percentile (the
 * median and each of --metric-percentiles).
 *
 * Rejected: drawing the PNG ourselves (a plotting library for one chart);
 * gnuplot is in deploy/install-deps.sh and kvf tune uses it too.
 */
#define _GNU_SOURCE
#include "kvf_bs_int.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

bool kvf_bs_find_gnuplot(char *buf, size_t cap)
{
    static const char *const dirs[] = {"/usr/bin", "/usr/local/bin", "/bin"};
    const char *path = getenv("PATH");
    char copy[4096];

    /* $PATH first (a gnuplot in /opt or ~/.local counts), then the usual folders */
    snprintf(copy, sizeof(copy), "%s", (path != NULL) ? path : "");
    for (char *save = NULL, *d = strtok_r(copy, ":", &save); d != NULL;
         d = strtok_r(NULL, ":", &save)) {
        snprintf(buf, cap, "%s/gnuplot", (d[0] != '\0') ? d : ".");
        if (access(buf, X_OK) == 0) {
            return true;
        }
    }
    for (size_t i = 0; i < sizeof(dirs) / sizeof(dirs[0]); ++i) {
        snprintf(buf, cap, "%s/gnuplot", dirs[i]);
        if (access(buf, X_OK) == 0) {
            return true;
        }
    }
    buf[0] = '\0';
    return false;
}

int kvf_bs_run_gnuplot(const char *gnuplot, const char *script, char *err, size_t cap)
{
    int status, fds[2];
    size_t len = 0;
    pid_t pid;

    err[0] = '\0';
    if (pipe(fds) != 0) {
        return -1;
    }
    fflush(stdout);   /* else the child's copy of the buffer is written a second time */
    fflush(stderr);
    pid = fork();
    if (pid < 0) {
        close(fds[0]);
        close(fds[1]);
        return -1;
    }
    if (pid == 0) {
        FILE *n = freopen("/dev/null", "w", stdout);
        (void)n;
        dup2(fds[1], STDERR_FILENO);   /* its warnings come back to the caller, not the user */
        close(fds[0]);
        close(fds[1]);
        execl(gnuplot, gnuplot, script, (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    for (;;) {
        char tmp[1024];
        ssize_t n = read(fds[0], tmp, sizeof(tmp));
        if ((n < 0) && (errno == EINTR)) {
            continue;
        }
        if (n <= 0) {
            break;
        }
        for (ssize_t i = 0; (i < n) && (len + 1 < cap); ++i) {   /* one line of text */
            err[len++] = ((tmp[i] == '\n') || (tmp[i] == '\r')) ? ' ' : tmp[i];
        }
    }
    err[len] = '\0';
    close(fds[0]);
    while (waitpid(pid, &status, 0) < 0) {
        if (errno != EINTR) {
            return -1;
        }
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* The percentiles drawn: the median unless p->pct has it, then p->pct. Their count. */
static int kvf_bs_plot_pcts(const kvf_bs_params_t *p, double *q)
{
    int n = 0;
    bool median = false;

    for (int i = 0; i < p->num_pct; ++i) {
        median |= (p->pct[i] == 50);
    }
    if (!median) {
        q[n++] = 50;
    }
    for (int i = 0; i < p->num_pct; ++i) {
        q[n++] = p->pct[i];
    }
    return n;
}

/* The data file: one row per run: its rate as a label, then @a q of TTFT, then of ITL. */
static int kvf_bs_plot_data(const char *dat, const double *q, int nq,
                            const kvf_bs_summary_t *runs, const double *rates, int n)
{
    FILE *f = fopen(dat, "w");

    if (f == NULL) {
        kvf_error("cannot write %s: %m", dat);
        return -1;
    }
    for (int r = 0; r < n; ++r) {
        const kvf_bs_stat_t *st[2] = {&runs[r].ttft, &runs[r].itl};

        if (rates[r] > 0) {
            fprintf(f, "\"%g\"", rates[r]);
        } else {
            fprintf(f, "\"inf\"");
        }
        for (int m = 0; m < 2; ++m) {
            for (int i = 0; i < nq; ++i) {
                fprintf(f, " %.4f", kvf_bs_percentile(st[m], q[i]));
            }
        }
        fprintf(f, "\n");
    }
    return (fclose(f) == 0) ? 0 : -1;
}

int kvf_bs_plot(const char *png, const kvf_bs_params_t *p, const kvf_bs_summary_t *runs,
                const double *rates, int n)
{
    char gnuplot[PATH_MAX], dat[PATH_MAX + 8], gp[PATH_MAX + 8], err[512];
    char model[KVF_CONFIG_STR_MAX], conc[32] = "unlimited";
    double q[KVF_BS_MAX_PCT + 1];
    int cols = kvf_bs_plot_pcts(p, q), rc;
    FILE *f;

    snprintf(model, sizeof(model), "%s", p->model);
    for (char *c = model; *c != '\0'; ++c) {
        *c = ((*c == '\'') || (*c == '\\') || (*c < ' ')) ? '_' : *c;   /* gnuplot quoting */
    }

    if (!kvf_bs_find_gnuplot(gnuplot, sizeof(gnuplot))) {
        fprintf(stderr, "kvf bench-serve: plot skipped: gnuplot not found (deploy/install-deps.sh "
                "installs gnuplot-nox)\n");
        return 0;
    }
    snprintf(dat, sizeof(dat), "%s.dat", png);
    snprintf(gp, sizeof(gp), "%s.gp", png);
    if (p->max_concurrency > 0) {
        snprintf(conc, sizeof(conc), "%d", p->max_concurrency);
    }
    if (kvf_bs_plot_data(dat, q, cols, runs, rates, n) != 0) {
        return -1;
    }
    f = fopen(gp, "w");
    if (f == NULL) {
        kvf_error("cannot write %s: %m", gp);
        return -1;
    }
    fprintf(f, "set terminal png size 1100,480\nset output '%s'\n"
               "set multiplot layout 1,2 title 'kvf bench-serve: %s, %d prompts, %d in / %d out "
               "tokens, max concurrency %s'\nset grid\nset key top left\n"
               "set xlabel 'request rate (req/s)'\nset yrange [0:*]\nset offsets 0.3, 0.3, 0, 0\n",
            png, model, p->num_requests, p->input_len, p->output_len, conc);
    for (int m = 0; m < 2; ++m) {
        fprintf(f, "set ylabel '%s (ms)'\nset title '%s'\nplot ", m ? "ITL" : "TTFT",
                m ? "inter-token latency" : "time to first token");
        for (int i = 0; i < cols; ++i) {
            char title[32];
            if (q[i] == 50) {
                snprintf(title, sizeof(title), "median");
            } else {
                snprintf(title, sizeof(title), "p%g", q[i]);
            }
            fprintf(f, "%s'%s' using 0:%d:xtic(1) with linespoints lw 2 pt 7 title '%s'",
                    i ? ", " : "", dat, 2 + m * cols + i, title);
        }
        fprintf(f, "\n");
    }
    fprintf(f, "unset multiplot\n");
    if (fclose(f) != 0) {
        kvf_error("cannot write %s: %m", gp);
        return -1;
    }
    rc = kvf_bs_run_gnuplot(gnuplot, gp, err, sizeof(err));
    unlink(dat);
    unlink(gp);
    if ((rc != 0) || (access(png, R_OK) != 0)) {   /* its warnings are shown only then */
        kvf_error("gnuplot %s failed (exit %d): %s", gp, rc, err);
        return -1;
    }
    return 1;
}
