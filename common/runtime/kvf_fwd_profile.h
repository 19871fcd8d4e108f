/*
 * Where a forward step's time goes: per call site of the forward (each kernel
 * entry point and collective that kvf_model_fwd.c calls, and the TP runner's
 * zeroing of the step's fresh blocks), on rank 0, split by
 * phase (steps that computed prompt tokens, and decode steps). For finding the
 * hot spot of a device on one run (`kvf bench-model --profile`), not for
 * throughput figures: every profiled call is bracketed by a device
 * synchronisation, so a call's time is its launch plus its execution, and the
 * profiled steps run slower than unprofiled ones.
 *
 * Design: off by default; a process-wide switch read by the forward on rank 0
 * only (the caller's thread, docs/ARCHITECTURE.md §5), so no lock is taken on
 * the hot path and the other ranks are never synchronised. Times collect in a
 * pending row set per step; the caller says after the step which phase it was
 * (kvf_fwd_profile_commit), as only the engine's stats tell.
 * Rejected: CUDA events per call (they time the GPU alone and miss the host
 * gaps between launches, which is what a step of small kernels loses most);
 * an external profiler (the bare GPU machines have none).
 */
#ifndef KVF_FWD_PROFILE_H
#define KVF_FWD_PROFILE_H

#include "kvf_device.h"

#include <stdbool.h>
#include <stdio.h>

typedef enum kvf_prof_phase {
    KVF_PROF_PREFILL = 0,   /* a step that computed prompt tokens (maybe decode ones too) */
    KVF_PROF_DECODE  = 1,   /* a step of decode tokens only */
    KVF_PROF_PHASES  = 2
} kvf_prof_phase_t;

/**
 * Switch profiling on or off for the whole process and clear what was
 * collected. Call between steps (no step running on any engine).
 */
void kvf_fwd_profile_enable(bool on);

/**
 * Whether the calling thread profiles @a dev's calls now: the switch is on and
 * @a rank is 0. Sets the thread's device for kvf_fwd_profile_begin/_end.
 */
bool kvf_fwd_profile_thread(int rank, const kvf_device_t *dev);

/** True between kvf_fwd_profile_thread() returning true and the end of the step. */
bool kvf_fwd_profile_active(void);

/**
 * Bracket one call: begin synchronises the thread's device and returns the
 * time (s, monotonic); end synchronises again and adds the interval to the
 * pending row of the call site (@a func, @a line, @a call: static strings,
 * the site's identity is @a call's address). Up to 256 sites; later sites
 * count in one "(other sites)" row. A failed synchronisation is ignored here
 * (the call's own status reports it).
 */
double kvf_fwd_profile_begin(void);
void kvf_fwd_profile_end(const char *func, int line, const char *call, double t0);

/**
 * Fold the pending rows (the steps run since the last commit) into @a phase,
 * with @a step_seconds the wall time of those steps as the caller measured it
 * (the rest, outside the profiled calls, is printed as its own row).
 */
void kvf_fwd_profile_commit(kvf_prof_phase_t phase, double step_seconds);

/**
 * Print the collected rows to @a f: per phase, sites by total time, each with
 * its share of the phase's step time, calls, total ms and mean us; then the
 * time outside the profiled calls. Prints nothing when nothing was collected.
 */
void kvf_fwd_profile_print(FILE *f);

/**
 * Calls of site @a call_prefix (the start of the call's text, e.g.
 * "kvf_mat_gemm(") summed over all its sites in @a phase; for tests.
 */
unsigned long long kvf_fwd_profile_calls(kvf_prof_phase_t phase, const char *call_prefix);

#endif
