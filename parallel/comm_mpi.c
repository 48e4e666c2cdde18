// The transport over MPI_COMM_WORLD (Open MPI). Errors are returned, not fatal: the world's
// handler is MPI_ERRORS_RETURN, and each call's code becomes one line.
#include "parallel_internal.h"

#include <limits.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

bool par_mpi_built(void) { return true; }

static int check(int code, const char *what, ag_err *err) {
    if (code == MPI_SUCCESS) return 0;
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(code, msg, &len);
    ag_err_set(err, "%s: %.*s", what, len, msg);
    return -1;
}

int par_mpi_world(par_comm *c, ag_err *err) {
    int inited = 0, provided = 0;
    MPI_Initialized(&inited);
    if (!inited) {
        // Only the calling thread talks to MPI (the compute pool never does).
        if (check(MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread", err) != 0) return -1;
        c->owns_mpi = true;
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &c->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &c->size);
    return 0;
}

void par_mpi_finalize(par_comm *c) {
    int done = 0;
    MPI_Finalized(&done);
    if (!done) MPI_Finalize();
    c->owns_mpi = false;
}

// MPI counts are ints: a larger buffer goes in chunks.
#define CHUNK (1 << 30)

int par_mpi_all_reduce(float *buf, size_t n, ag_err *err) {
    for (size_t at = 0; at < n; at += CHUNK) {
        int k = (int)(n - at < CHUNK ? n - at : CHUNK);
        if (check(MPI_Allreduce(MPI_IN_PLACE, buf + at, k, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD), "MPI_Allreduce", err))
            return -1;
    }
    return 0;
}

static int to_ints(const size_t *in, int *out, int size, const char *what, ag_err *err) {
    for (int r = 0; r < size; r++) {
        if (in[r] > INT_MAX) {
            ag_err_set(err, "%s: %zu elements for rank %d, more than MPI's int counts hold", what, in[r], r);
            return -1;
        }
        out[r] = (int)in[r];
    }
    return 0;
}

int par_mpi_reduce_scatter(float *buf, const size_t *counts, int size, ag_err *err) {
    int *n = malloc((size_t)size * sizeof *n);
    if (!n) {
        ag_err_set(err, "MPI_Reduce_scatter: out of memory");
        return -1;
    }
    int rc = to_ints(counts, n, size, "MPI_Reduce_scatter", err);
    if (rc == 0)
        rc = check(MPI_Reduce_scatter(MPI_IN_PLACE, buf, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD), "MPI_Reduce_scatter",
                   err);
    free(n);
    return rc;
}

int par_mpi_all_gather(void *buf, const size_t *counts, const size_t *displs, int size, ag_err *err) {
    int *n = malloc(2 * (size_t)size * sizeof *n);
    if (!n) {
        ag_err_set(err, "MPI_Allgatherv: out of memory");
        return -1;
    }
    int rc = to_ints(counts, n, size, "MPI_Allgatherv", err);
    if (rc == 0) rc = to_ints(displs, n + size, size, "MPI_Allgatherv", err);
    if (rc == 0)
        rc = check(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, n, n + size, MPI_BYTE, MPI_COMM_WORLD),
                   "MPI_Allgatherv", err);
    free(n);
    return rc;
}

int par_mpi_gather_text(const par_comm *c, const char *mine, char ***all, ag_err *err) {
    size_t len = strlen(mine) + 1;
    if (len > INT_MAX) {
        ag_err_set(err, "MPI_Gatherv: a report of %zu bytes", len);
        return -1;
    }
    int n = (int)len, *lens = NULL, *displs = NULL;
    char *buf = NULL;
    bool root = c->rank == 0;
    if (root) {
        lens = calloc((size_t)c->size, sizeof *lens);
        displs = calloc((size_t)c->size, sizeof *displs);
    }
    int rc = root && (!lens || !displs) ? -1 : 0;
    if (rc) ag_err_set(err, "MPI_Gather: out of memory");
    if (rc == 0) rc = check(MPI_Gather(&n, 1, MPI_INT, lens, 1, MPI_INT, 0, MPI_COMM_WORLD), "MPI_Gather", err);
    long long total = 0;
    for (int r = 0; rc == 0 && root && r < c->size; r++) {
        displs[r] = (int)total;
        total += lens[r];
        if (total > INT_MAX) {
            ag_err_set(err, "MPI_Gatherv: the reports hold more than 2^31 bytes");
            rc = -1;
        }
    }
    if (rc == 0 && root && !(buf = malloc((size_t)total))) {
        ag_err_set(err, "MPI_Gatherv: out of memory");
        rc = -1;
    }
    if (rc == 0)
        rc = check(MPI_Gatherv(mine, n, MPI_CHAR, buf, lens, displs, MPI_CHAR, 0, MPI_COMM_WORLD), "MPI_Gatherv", err);
    if (rc == 0 && root) {
        char **a = calloc((size_t)c->size, sizeof *a);
        for (int r = 0; a && r < c->size; r++)
            if (!(a[r] = strdup(buf + displs[r]))) {
                for (int q = 0; q < r; q++) free(a[q]);
                free(a);
                a = NULL;
            }
        if (!a) {
            ag_err_set(err, "out of memory");
            rc = -1;
        }
        *all = a;
    }
    free(buf);
    free(lens);
    free(displs);
    return rc;
}

int par_mpi_max_int(int mine, int *out, ag_err *err) {
    return check(MPI_Allreduce(&mine, out, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD), "MPI_Allreduce", err);
}

int par_mpi_agree(int mine, double timeout_s, int *worst, ag_err *err) {
    MPI_Request req;
    if (check(MPI_Iallreduce(&mine, worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD, &req), "MPI_Iallreduce", err) != 0)
        return -1;
    struct timespec t0, t, nap = {0, 1000000};
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        int done = 0;
        if (check(MPI_Test(&req, &done, MPI_STATUS_IGNORE), "MPI_Test", err) != 0) return -1;
        if (done) return 0;
        clock_gettime(CLOCK_MONOTONIC, &t);
        if ((double)(t.tv_sec - t0.tv_sec) + 1e-9 * (double)(t.tv_nsec - t0.tv_nsec) > timeout_s) {
            ag_err_set(err, "the other ranks did not reach the end of the run within %.0f s", timeout_s);
            return -1;
        }
        nanosleep(&nap, NULL);
    }
}

void par_mpi_abort(int code) { MPI_Abort(MPI_COMM_WORLD, code); }
