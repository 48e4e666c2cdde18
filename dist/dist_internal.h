// Private to dist/: the communicator and its transport (comm_mpi.c, or comm_none.c without MPI).
#pragma once

#include "dist.h"

struct dist_comm {
    int rank, size;
    bool simulated; // collectives counted, nothing moved
    bool owns_mpi;  // this communicator initialised MPI and finalises it
    dist_stats stats;
};

// One collective of `bytes` counted (what a simulated rank does instead of moving them).
void dist_count(dist_comm *c, dist_collective k, uint64_t bytes, double seconds);

// The transport: MPI_COMM_WORLD. Each returns 0, or -1 with MPI's message in err.
int dist_mpi_world(dist_comm *c, ag_err *err);
void dist_mpi_finalize(dist_comm *c);
int dist_mpi_all_reduce(float *buf, size_t n, ag_err *err);
int dist_mpi_reduce_scatter(float *buf, const size_t *counts, int size, ag_err *err);
int dist_mpi_all_gather(float *buf, const size_t *counts, const size_t *displs, int size, ag_err *err);
int dist_mpi_gather_text(const dist_comm *c, const char *mine, char ***all, ag_err *err);
int dist_mpi_max_int(int mine, int *out, ag_err *err);
int dist_mpi_agree(int mine, double timeout_s, int *worst, ag_err *err);
void dist_mpi_abort(int code);
