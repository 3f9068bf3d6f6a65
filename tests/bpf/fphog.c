// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
/* fphog.c -- a CPU hog and a CPU-hungry victim with frame pointers, for the
 * stacks-at-alarm tests (tests/bpf/test_stacks.py). Built with
 * gcc -O1 -fno-omit-frame-pointer, so a BPF user-stack walk reaches the
 * distinctively named functions below.
 *
 *   fphog hog SECONDS      spin in jitterscope_hog_spin (named "fphog")
 *   fphog victim SECONDS   ~3 ms of work in jitterscope_victim_work, 1 ms sleep, again
 *                          (named "fpvictim")
 */
#include <stdlib.h>
#include <sys/prctl.h>
#include <string.h>
#include <time.h>

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

volatile unsigned long sink;

__attribute__((noinline)) void jitterscope_hog_spin(double until)
{
    while (now() < until)
        for (int i = 0; i < 10000; i++)
            sink += i;
}

__attribute__((noinline)) void jitterscope_victim_work(double seconds)
{
    double until = now() + seconds;
    while (now() < until)
        for (int i = 0; i < 1000; i++)
            sink += i;
}

int main(int argc, char **argv)
{
    if (argc != 3)
        return 2;
    double end = now() + atof(argv[2]);
    int hog = strcmp(argv[1], "hog") == 0;
    prctl(PR_SET_NAME, hog ? "fphog" : "fpvictim", 0, 0, 0);
    if (hog) {
        jitterscope_hog_spin(end);
        return 0;
    }
    struct timespec pause = {0, 1000000};
    while (now() < end) {
        jitterscope_victim_work(0.003);
        nanosleep(&pause, NULL);
    }
    return 0;
}
