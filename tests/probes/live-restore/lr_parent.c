//! lr_parent.c: the parent that run.sh kills with -9 (questions 1 and 2): it starts CMD as its child,
//! without PDEATHSIG, and either holds CMD's stdout/stderr as a pipe that it reads into LOG (as meshd reads
//! the MPS control daemon's output), or gives CMD the file LOG directly. Writes CMD's pid to PIDFILE and
//! waits for it. `pipe-nosigpipe` is `pipe` with SIGPIPE ignored in CMD (a disposition exec keeps), so that a
//! CMD that keeps the default gets EPIPE instead of dying once the reader is gone.
//! Build: gcc -O2 -o lr_parent lr_parent.c
//! Usage: lr_parent pipe|pipe-nosigpipe|file LOG PIDFILE CMD [ARGS...]
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv) {
    int no_sigpipe = argc >= 2 && strcmp(argv[1], "pipe-nosigpipe") == 0;
    if (argc < 5 || (strcmp(argv[1], "pipe") != 0 && strcmp(argv[1], "file") != 0 && !no_sigpipe)) {
        fprintf(stderr, "usage: lr_parent pipe|pipe-nosigpipe|file LOG PIDFILE CMD [ARGS...]\n");
        return 2;
    }
    int use_pipe = strcmp(argv[1], "file") != 0;
    int log = open(argv[2], O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (log < 0) {
        fprintf(stderr, "lr_parent: open %s: %s\n", argv[2], strerror(errno));
        return 3;
    }
    int p[2] = {-1, -1};
    if (use_pipe && pipe(p) != 0) {
        fprintf(stderr, "lr_parent: pipe: %s\n", strerror(errno));
        return 3;
    }
    pid_t c = fork();
    if (c < 0) {
        fprintf(stderr, "lr_parent: fork: %s\n", strerror(errno));
        return 3;
    }
    if (c == 0) {
        int out = use_pipe ? p[1] : log;
        dup2(out, 1);
        dup2(out, 2);
        if (use_pipe) {
            close(p[0]);
            close(p[1]);
        }
        close(log);
        if (no_sigpipe) signal(SIGPIPE, SIG_IGN);
        execvp(argv[4], argv + 4);
        fprintf(stderr, "lr_parent: exec %s: %s\n", argv[4], strerror(errno));
        _exit(127);
    }
    FILE *pf = fopen(argv[3], "w");
    if (pf == NULL) {
        fprintf(stderr, "lr_parent: open %s: %s\n", argv[3], strerror(errno));
        kill(c, SIGKILL);
        return 3;
    }
    fprintf(pf, "%d\n", (int)c);
    fclose(pf);
    if (use_pipe) {
        close(p[1]);
        char buf[4096];
        ssize_t n;
        // Read until EOF: every holder of the write end (CMD and whatever it forked) has closed it.
        while ((n = read(p[0], buf, sizeof buf)) != 0) {
            if (n < 0) {
                if (errno == EINTR) continue;
                break;
            }
            if (write(log, buf, (size_t)n) != n) break;
        }
    }
    int st = 0;
    while (waitpid(c, &st, 0) < 0 && errno == EINTR) {}
    dprintf(log, "lr_parent: child %d ended: %s %d\n", (int)c, WIFEXITED(st) ? "exit" : "signal",
            WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
    return 0;
}
