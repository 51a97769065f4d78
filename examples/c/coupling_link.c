/* A C model rank on libembodyrl_link: its columns' corrections from the coupling policy, its steps
 * streamed to the learner, the learner's weights followed (hal/coupling/c/embodyrl_link.h).
 *
 *   cmake -S hal/coupling/c -B build && cmake --build build
 *   cc -O2 -Ihal/coupling/c -o coupling_link examples/c/coupling_link.c -Lbuild -lembodyrl_link
 *   ./coupling_link "levels=70 features=3 ... policy=P.msgpack learner=tcp://..." COLUMNS STEPS IN.f32 OUT.f32 [PAUSE_MS]
 *
 * IN.f32 holds records of state [COLUMNS][levels][features], context [COLUMNS][context] and target
 * [COLUMNS][levels] (float32, C order), used in turn (the file's records repeat when STEPS is
 * larger); OUT.f32 gets each step's correction [COLUMNS][levels]. One JSON line of the link's
 * counters (and its ZeroMQ I/O threads' CPU) goes to stdout at the end; each step's status
 * (0 policy, 1 zeros, -1 bad input) to OUT.status. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "embodyrl_link.h"

/* CPU seconds of this process's ZeroMQ I/O threads (Linux /proc; -1 elsewhere): the link's bytes
 * are moved there, so their CPU is the link's too. */
static double io_threads_cpu_s(void) {
    DIR *tasks = opendir("/proc/self/task");
    if (!tasks) return -1;
    double total = 0;
    struct dirent *e;
    while ((e = readdir(tasks))) {
        char path[512], comm[64] = "";
        unsigned long long ns = 0;
        snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        int io = fgets(comm, sizeof comm, f) && !strncmp(comm, "ZMQbg", 5);
        fclose(f);
        snprintf(path, sizeof path, "/proc/self/task/%s/schedstat", e->d_name);
        if (io && (f = fopen(path, "r"))) {
            if (fscanf(f, "%llu", &ns) == 1) total += 1e-9 * (double)ns;
            fclose(f);
        }
    }
    closedir(tasks);
    return total;
}

int main(int argc, char **argv) {
    if (argc < 6) {
        fprintf(stderr, "usage: %s CONFIG COLUMNS STEPS IN.f32 OUT.f32 [PAUSE_MS]\n", argv[0]);
        return 2;
    }
    link_config cfg;
    link_config_defaults(&cfg);
    if (link_config_parse(&cfg, argv[1]) != 0) return 2;
    long columns = atol(argv[2]), steps = atol(argv[3]), pause_ms = argc > 6 ? atol(argv[6]) : 0;
    size_t n_state = (size_t)columns * cfg.levels * cfg.features, n_context = (size_t)columns * cfg.context;
    size_t n_target = (size_t)columns * cfg.levels, record = n_state + n_context + n_target;
    FILE *in = fopen(argv[4], "rb");
    if (!in) { fprintf(stderr, "cannot open %s\n", argv[4]); return 2; }
    fseek(in, 0, SEEK_END);
    long records = ftell(in) / (long)(4 * record);
    fseek(in, 0, SEEK_SET);
    float *data = malloc(4 * record * (records > 0 ? records : 1));
    if (records < 1 || fread(data, 4 * record, (size_t)records, in) != (size_t)records) {
        fprintf(stderr, "%s holds no whole record of %zu floats\n", argv[4], record);
        return 2;
    }
    fclose(in);
    link_t *link = link_open(&cfg);
    if (!link) return 1;
    FILE *out = fopen(argv[5], "wb");
    char status_path[1024];
    snprintf(status_path, sizeof status_path, "%s.status", argv[5]);
    FILE *status_file = fopen(status_path, "w");
    float *correction = malloc(4 * n_target);
    for (long t = 0; t < steps; t++) {
        const float *r = data + (size_t)(t % records) * record;
        int status = link_exchange(link, (int)columns, r, cfg.context ? r + n_state : NULL, r + n_state + n_context,
                                   correction);
        fwrite(correction, 4, n_target, out);
        fprintf(status_file, "%d\n", status);
        fflush(status_file);
        if (pause_ms) nanosleep(&(struct timespec){pause_ms / 1000, (pause_ms % 1000) * 1000000L}, NULL);
    }
    fclose(out);
    fclose(status_file);
    link_flush(link, 5.0);
    double io_cpu_s = io_threads_cpu_s();
    link_stats s;
    link_stats_get(link, &s);
    link_close(link, 0.0);
    printf("{\"exchanges\": %ld, \"zero_answers\": %ld, \"steps_sent\": %ld, \"steps_dropped\": %ld, "
           "\"weights_taken\": %ld, \"weights_refused\": %ld, \"reconnects\": %ld, \"link_cpu_s\": %.6f, "
           "\"inference_cpu_s\": %.6f, \"io_threads_cpu_s\": %.6f, \"version\": [%lld, %lld]}\n",
           s.exchanges, s.zero_answers, s.steps_sent, s.steps_dropped, s.weights_taken, s.weights_refused,
           s.reconnects, s.link_cpu_s, s.inference_cpu_s, io_cpu_s, (long long)s.incarnation, (long long)s.count);
    free(data), free(correction);
    return 0;
}
