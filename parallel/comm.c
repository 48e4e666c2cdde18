// The communicator: rank and size, the collectives' counts and times, the simulated rank.
#include "parallel_internal.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int par_comm_world(par_comm **out, ag_err *err) {
    *out = calloc(1, sizeof **out);
    if (!*out) {
        ag_err_set(err, "out of memory");
        return -1;
    }
    if (par_mpi_world(*out, err) == 0) return 0;
    free(*out);
    *out = NULL;
    return -1;
}

int par_comm_simulated(par_comm **out, int rank, int size, ag_err *err) {
    *out = NULL;
    if (size < 1 || rank < 0 || rank >= size) {
        ag_err_set(err, "a simulated rank %d of %d ranks: expected 0 <= rank < ranks", rank, size);
        return -1;
    }
    if (!(*out = calloc(1, sizeof **out))) {
        ag_err_set(err, "out of memory");
        return -1;
    }
    (*out)->rank = rank;
    (*out)->size = size;
    (*out)->simulated = true;
    return 0;
}

void par_comm_free(par_comm *c) {
    if (!c) return;
    if (c->owns_mpi) par_mpi_finalize(c);
    free(c);
}

par_group par_expert_data_group(const par_comm *c, int ep) {
    if (ep <= 1 || c->size % ep != 0) return (par_group){c->size, c->rank};
    return (par_group){c->size / ep, c->rank / ep};
}

int par_rank(const par_comm *c) { return c->rank; }
int par_size(const par_comm *c) { return c->size; }
bool par_is_simulated(const par_comm *c) { return c->simulated; }
par_stats par_get_stats(const par_comm *c) { return c->stats; }

double par_comm_seconds(const par_comm *c) {
    double s = 0;
    for (int k = 0; k < PAR_NCOLLECTIVES; k++) s += c->stats.seconds[k];
    return s;
}

const char *par_collective_name(par_collective k) {
    static const char *const names[] = {"all_reduce", "reduce_scatter", "all_gather"};
    return (unsigned)k < PAR_NCOLLECTIVES ? names[k] : "?";
}

// A ring all-reduce over n ranks sends 2 (n-1)/n of the buffer from each rank, reduce-scatter
// and all-gather (n-1)/n.
void par_count_over(par_comm *c, par_collective k, uint64_t bytes, int ranks, double seconds) {
    uint64_t n = (uint64_t)ranks, sent = n > 1 ? bytes / n * (n - 1) : 0;
    c->stats.calls[k]++;
    c->stats.bytes[k] += bytes;
    c->stats.sent_bytes[k] += k == PAR_ALL_REDUCE ? 2 * sent : sent;
    c->stats.seconds[k] += seconds;
}

void par_count(par_comm *c, par_collective k, uint64_t bytes, double seconds) {
    par_count_over(c, k, bytes, c->size, seconds);
}

// Whether a collective moves data: a real communicator of several ranks, a buffer with data.
static bool moves(const par_comm *c, const void *buf) { return !c->simulated && c->size > 1 && buf; }

int par_all_reduce_sum(par_comm *c, float *buf, size_t n, size_t elem_bytes, ag_err *err) {
    double t0 = now_s();
    if (moves(c, buf) && par_mpi_all_reduce(buf, n, err) != 0) return -1;
    par_count(c, PAR_ALL_REDUCE, (uint64_t)n * elem_bytes, now_s() - t0);
    return 0;
}

int par_reduce_scatter_sum(par_comm *c, float *buf, const size_t *counts, size_t elem_bytes, ag_err *err) {
    double t0 = now_s();
    if (moves(c, buf) && par_mpi_reduce_scatter(buf, counts, c->size, err) != 0) return -1;
    uint64_t total = 0;
    for (int r = 0; counts && r < c->size; r++) total += counts[r];
    par_count(c, PAR_REDUCE_SCATTER, total * elem_bytes, now_s() - t0);
    return 0;
}

int par_all_gather(par_comm *c, void *buf, const size_t *counts, const size_t *displs, ag_err *err) {
    double t0 = now_s();
    if (moves(c, buf) && par_mpi_all_gather(buf, counts, displs, c->size, err) != 0) return -1;
    uint64_t total = 0;
    for (int r = 0; counts && r < c->size; r++) total += counts[r];
    par_count(c, PAR_ALL_GATHER, total, now_s() - t0);
    return 0;
}

int par_gather_text(par_comm *c, const char *mine, char ***all, ag_err *err) {
    *all = NULL;
    if (!c->simulated && c->size > 1) return par_mpi_gather_text(c, mine, all, err);
    if (c->rank != 0) return 0;
    char **a = calloc(1, sizeof *a);
    if (!a || !(a[0] = strdup(mine))) {
        free(a);
        ag_err_set(err, "out of memory");
        return -1;
    }
    *all = a;
    return 0;
}

int par_max_int(par_comm *c, int mine, int *out, ag_err *err) {
    *out = mine;
    return !c->simulated && c->size > 1 ? par_mpi_max_int(mine, out, err) : 0;
}

int par_agree(par_comm *c, int mine, double timeout_s, int *worst, ag_err *err) {
    *worst = mine;
    return !c->simulated && c->size > 1 ? par_mpi_agree(mine, timeout_s, worst, err) : 0;
}

void par_abort(par_comm *c, int code) {
    if (c && !c->simulated) par_mpi_abort(code);
}
