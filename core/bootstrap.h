/*
 * Communicators from the environment (bootstrap.c): rank, size and
 * rendezvous from SMDDP_* settings or the launcher's variables (torchrun,
 * Open MPI, Slurm), through the built-in TCP store that rank 0 serves.
 */
#ifndef SMDDP_CORE_BOOTSTRAP_H
#define SMDDP_CORE_BOOTSTRAP_H

#include "comm.h"

smddp_status_t smddp__comm_create_from_env(const smddp_comm_config_t *config,
                                           smddp_comm_t *out);

#endif /* SMDDP_CORE_BOOTSTRAP_H */
