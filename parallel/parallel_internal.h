// Private to parallel/: the communicator and its transport (comm_mpi.c, or comm_none.c without MPI).
#pragma once

#include "parallel.h"

struct par_comm {
    int rank, size;
    bool simulated; // collectives counted, nothing moved
    bool owns_mpi;  // this communicator initialised MPI and finalises it
    par_stats stats;
};

// One collective of `bytes` counted (what a simulated rank does instead of moving them).
void par_count(par_comm *c, par_collective k, uint64_t bytes, double seconds);
// The same over a group of `ranks` of the communicator (an expert-data-parallel group).
void par_count_over(par_comm *c, par_collective k, uint64_t bytes, int ranks, double seconds);

// The transport: MPI_COMM_WORLD. Each returns 0, or -1 with MPI's message in err.
int par_mpi_world(par_comm *c, ag_err *err);
void par_mpi_finalize(par_comm *c);
int par_mpi_all_reduce(float *buf, size_t n, ag_err *err);
int par_mpi_reduce_scatter(float *buf, const size_t *counts, int size, ag_err *err);
int par_mpi_all_gather(void *buf, const size_t *counts, const size_t *displs, int size, ag_err *err); // bytes
int par_mpi_gather_text(const par_comm *c, const char *mine, char ***all, ag_err *err);
int par_mpi_max_int(int mine, int *out, ag_err *err);
int par_mpi_agree(int mine, double timeout_s, int *worst, ag_err *err);
void par_mpi_abort(int code);
