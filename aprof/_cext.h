/*
 * What the two halves of aprof's C extension share: the clock and the
 * thread-local storage class.
 *
 *   _ctracer.c  the Python tracer (SPEC 8.1) and the module
 *   _cranges.c  the range fast path under aprof.record_function (SPEC 3)
 */
#ifndef APROF_CEXT_H
#define APROF_CEXT_H

#include <Python.h>
#include <stdint.h>
#include <time.h>

static inline uint64_t
now_ns(void)
{
    /* time.perf_counter_ns() reads CLOCK_MONOTONIC on Linux: the tracer's
     * and the ranges' times must be on the same clock as everything else
     * aprof records (task steps, Python-path ranges). */
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* initial-exec: a shared library's TLS otherwise goes through
 * __tls_get_addr, a call on every access. */
#if defined(__GNUC__)
#define APROF_TLS _Thread_local __attribute__((tls_model("initial-exec")))
#else
#define APROF_TLS _Thread_local
#endif

/* _cranges.c: add RangeCore, the stepping object and _range_setup to the
 * module. Returns -1 with an exception set on failure. */
int aprof_ranges_init(PyObject *module);

#endif
