/* Shared by the dist layer only: the communicators and the collective watchdog. */
#ifndef EMBER_DIST_INTERNAL_H
#define EMBER_DIST_INTERNAL_H

#include "ember/dist.h"

#include <mpi.h>

/* Two duplicates of MPI_COMM_WORLD: gradient reductions run inside StarPU
 * tasks (on workers) while control collectives (broadcast, metrics, config
 * check) run on the calling thread; MPI orders collectives per communicator,
 * so the two streams must not share one. */
extern MPI_Comm em__dist_comm_grad, em__dist_comm_ctl;
extern int em__dist_rank, em__dist_world;

/* Watchdog slots: a collective in progress is registered with its start time;
 * the watchdog thread aborts the job when one exceeds EMBER_DIST_TIMEOUT. */
enum { EM_DIST_SLOT_GRAD = 0, EM_DIST_SLOT_CTL = 1, EM_DIST_NSLOTS = 2 };
void em__dist_watch_begin(int slot, const char *what);
void em__dist_watch_end(int slot);

/* allreduce.c: the chain token and codelet (registered after em_init). */
em_status em__dist_tasks_init(void);
void em__dist_tasks_shutdown(void);

/* Largest element count passed to one MPI call. */
#define EM_DIST_MPI_CHUNK ((int64_t)1 << 30)

#endif
