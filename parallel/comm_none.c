// A build without MPI: the simulated rank alone; MPI_COMM_WORLD is refused, naming the build.
#include "parallel_internal.h"

bool par_mpi_built(void) { return false; }

int par_mpi_world(par_comm *c, ag_err *err) {
    (void)c;
    ag_err_set(err, "this membill was built without MPI: configure with cmake -DMEMBILL_MPI=ON (Open MPI: "
                    "apt-get install libopenmpi-dev openmpi-bin) and run it under mpirun");
    return -1;
}

// Never reached: only a communicator from par_mpi_world moves data.
void par_mpi_finalize(par_comm *c) { (void)c; }
int par_mpi_all_reduce(float *buf, size_t n, ag_err *err) {
    (void)buf, (void)n;
    ag_err_set(err, "no MPI in this build");
    return -1;
}
int par_mpi_reduce_scatter(float *buf, const size_t *counts, int size, ag_err *err) {
    (void)buf, (void)counts, (void)size;
    ag_err_set(err, "no MPI in this build");
    return -1;
}
int par_mpi_all_gather(void *buf, const size_t *counts, const size_t *displs, int size, ag_err *err) {
    (void)buf, (void)counts, (void)displs, (void)size;
    ag_err_set(err, "no MPI in this build");
    return -1;
}
int par_mpi_gather_text(const par_comm *c, const char *mine, char ***all, ag_err *err) {
    (void)c, (void)mine, (void)all;
    ag_err_set(err, "no MPI in this build");
    return -1;
}
int par_mpi_max_int(int mine, int *out, ag_err *err) {
    (void)mine, (void)out;
    ag_err_set(err, "no MPI in this build");
    return -1;
}
int par_mpi_agree(int mine, double timeout_s, int *worst, ag_err *err) {
    (void)mine, (void)timeout_s, (void)worst;
    ag_err_set(err, "no MPI in this build");
    return -1;
}
void par_mpi_abort(int code) { (void)code; }
