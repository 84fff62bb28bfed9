/*
 * How the ranks of a node wait for each other (see shm_segment.h): each
 * publishes the CPUs it may run on, and waits spin, yield, then sleep for
 * as long as the ranks sharing cores or not calls for.
 */
#include <sched.h>
#include <unistd.h>

#include "../param.h"
#include "shm_segment.h"

void smddp__shm_publish_affinity(shm_ctrl_t *ctrl)
{
    cpu_set_t set;
    bool known = sched_getaffinity(0, sizeof(set), &set) == 0;
    for (int w = 0; w < AFFINITY_WORDS; w++) {
        uint64_t bits = 0;
        for (int b = 0; b < 64; b++)
            if (!known || CPU_ISSET(w * 64 + b, &set)) bits |= 1ULL << b;
        ctrl->cpus[w] = bits;
    }
}

void smddp__shm_set_wait_policy(smddp__shm_t *s, int p)
{
    int cpus = 0;
    for (int w = 0; w < AFFINITY_WORDS; w++) {
        uint64_t bits = 0;
        for (int lr = 0; lr < p; lr++) bits |= s->ctrl[lr].cpus[w];
        cpus += __builtin_popcountll(bits);
    }
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    if (online > 0 && cpus > online) cpus = (int)online;
    bool oversubscribed = p > cpus;
    s->oversubscribed = oversubscribed;
    /*
     * Spin for about the skew between ranks that call in from Python (tens
     * of microseconds) when every rank has a core; barely when ranks share
     * cores, since a peer that is not running cannot arrive and may be
     * waiting for this very core. Yielding next is nearly as fast as spinning
     * when cores are free (the call returns at once) and hands the core over
     * when they are not. Sleeping on the futex comes last, since a wake-up
     * costs tens of microseconds.
     */
    const smddp__params_t *params = smddp__params();
    s->spin_ns = params->spin >= 0 ? (int64_t)params->spin * 1000
                                   : (oversubscribed ? 1000 : 50 * 1000);
    s->yield_ns = params->yield >= 0 ? (int64_t)params->yield * 1000
                                     : (oversubscribed ? 200 * 1000 : 2 * 1000 * 1000);
}
