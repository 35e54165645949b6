// wake_loop: the CPU cost of an MPS worker's checking loop without its cuStreamQuery, measured by the process itself.
//
// `gcc -O2 -o /tmp/wake_loop tests/probes/wake_loop.c && /tmp/wake_loop poll 1000 5`: MODE `sleep`
// (nanosleep: std::thread::sleep) or `poll` (ppoll on an empty pipe with that timeout: the worker's
// wait for its next command), PERIOD in µs, SECONDS. Prints wakes per second and CPU as a share of
// one core (getrusage, and /proc/self/stat's clock ticks), and CPU µs per wake. The worker's
// cuStreamQuery, which may talk to the MPS server, is not in it: that needs the GPU (pidstat).
#define _GNU_SOURCE
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9; }
static double cpu(void) { struct rusage r; getrusage(RUSAGE_SELF, &r);
  return r.ru_utime.tv_sec + r.ru_utime.tv_usec / 1e6 + r.ru_stime.tv_sec + r.ru_stime.tv_usec / 1e6; }
static long stat_ticks(void) { FILE *f = fopen("/proc/self/stat", "r"); char b[1024]; size_t n = fread(b, 1, sizeof b - 1, f); fclose(f); b[n] = 0;
  char *p = strrchr(b, ')') + 2; long ut = 0, st = 0; int field = 3; char *tok = strtok(p, " ");
  while (tok) { if (field == 14) ut = atol(tok); if (field == 15) { st = atol(tok); break; } tok = strtok(NULL, " "); field++; } return ut + st; }

int main(int argc, char **argv) {
  if (argc != 4 || (strcmp(argv[1], "sleep") && strcmp(argv[1], "poll")) || atol(argv[2]) <= 0 || atof(argv[3]) <= 0) {
    fprintf(stderr, "usage: wake_loop sleep|poll PERIOD_US SECONDS\n");
    return 2;
  }
  const char *mode = argv[1]; long us = atol(argv[2]); double secs = atof(argv[3]);
  int fds[2]; if (pipe(fds)) return 1;
  long wakes = 0; double t0 = now(), c0 = cpu(); long k0 = stat_ticks();
  struct timespec ts = { us / 1000000, (us % 1000000) * 1000 };
  while (now() - t0 < secs) {
    if (!strcmp(mode, "sleep")) nanosleep(&ts, NULL);
    else { struct pollfd p = { fds[0], POLLIN, 0 }; struct timespec to = ts; ppoll(&p, 1, &to, NULL); }
    (void)now(); // the worker reads the clock each turn (its alive pulse)
    wakes++;
  }
  double wall = now() - t0, c = cpu() - c0; long k = stat_ticks() - k0;
  printf("%-5s period %6ld us: %7.0f wakes/s, CPU %.3f%% of a core (getrusage), %.2f%% (/proc/self/stat ticks), %.2f us CPU per wake\n",
    mode, us, wakes / wall, 100 * c / wall, 100.0 * k / sysconf(_SC_CLK_TCK) / wall, 1e6 * c / wakes);
  return 0;
}
