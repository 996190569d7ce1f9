/*
 * What the two halves of aprof's C extension share: the clock and the
 * thread-local storage class.
 *
 *   _ctracer.c  the Python tracer (SPEC 8.1) and the module
 *   _cranges.c  the range fast path under aprof.record_function (SPEC 3)
 *   _cevents.c  consolidation at stop: raw records -> FunctionEvents (SPEC 6)
 *   _ctasks.c   the asyncio task hooks' hot path (SPEC 7.1-7.3)
 *   _csampler.c the task-aware sampler (SPEC 8.4)
 *   _cblocks.c  RangeBlock: plain ranges' raw records, packed (issue 17)
 *   _cmemory.c  profile_memory's allocator hooks (issue 21)
 */
#ifndef APROF_CEXT_H
#define APROF_CEXT_H

#include <Python.h>
#include <stdint.h>
#include <time.h>

static inline uint64_t
now_ns(void)
{
    /* The clock of time.perf_counter_ns(): the tracer's and the ranges'
     * times must be on the same clock as everything else aprof records
     * (task steps, Python-path ranges). Python reads CLOCK_MONOTONIC on
     * Linux and the BSDs, mach_absolute_time() (CLOCK_UPTIME_RAW) on macOS. */
#if defined(__APPLE__)
    return clock_gettime_nsec_np(CLOCK_UPTIME_RAW);
#else
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
#endif
}

/* initial-exec: a shared library's TLS otherwise goes through
 * __tls_get_addr, a call on every access. */
#if defined(__GNUC__)
#define APROF_TLS _Thread_local __attribute__((tls_model("initial-exec")))
#else
#define APROF_TLS _Thread_local
#endif

/* The per-event paths are a few loads and stores; a call per helper (with
 * its register saves) would cost as much as the work. Slow paths stay out
 * of line so the inlined fast path stays small. */
#if defined(__GNUC__)
#define APROF_INLINE inline __attribute__((always_inline))
#define APROF_NOINLINE __attribute__((noinline))
#define APROF_LIKELY(x) __builtin_expect(!!(x), 1)
#define APROF_UNLIKELY(x) __builtin_expect(!!(x), 0)
#else
#define APROF_INLINE inline
#define APROF_NOINLINE
#define APROF_LIKELY(x) (x)
#define APROF_UNLIKELY(x) (x)
#endif

/* _cranges.c: add RangeCore, the stepping object and _range_setup to the
 * module. Returns -1 with an exception set on failure. */
int aprof_ranges_init(PyObject *module);

/* _cranges.c: the logical thread stepping on this OS thread (a strong
 * reference, or NULL) and the context it was published in (borrowed, only
 * compared; NULL: any). _ctasks.c publishes asyncio steps here. */
extern APROF_TLS PyObject *aprof_stepping_lt;
extern APROF_TLS PyObject *aprof_stepping_ctx;

/* The slot of an object's address in an open-addressing table of mask + 1
 * slots (a power of two): Fibonacci hashing of the address, whose low bits
 * are alignment. */
static APROF_INLINE size_t
hash_ptr(const void *p, size_t mask)
{
    uint64_t x = (uint64_t)(uintptr_t)p;
    x = (x >> 4) * 0x9E3779B97F4A7C15ull;
    return (size_t)(x >> 32) & mask;
}

/* _ctasks.c: whether logical thread `lt` is a task's (an exact TaskThread
 * with its fields set): 1 with its id, its name, kind and OS thread id
 * (borrowed), and the address of its `_block` slot (the block of
 * TASK_BLOCKS its ranges go to: a strong reference, or NULL or None);
 * else 0. No exception either way. */
int aprof_task_owner(PyObject *lt, int64_t *id, PyObject **name, PyObject **kind, PyObject **os_tid,
                     PyObject ***block);

/* _ctasks.c: add StepLog, StepCall, CallSoonHook and the task hooks' set-up
 * functions to the module. Returns -1 with an exception set on failure. */
int aprof_tasks_init(PyObject *module);

/* _cevents.c: add EventView, ViewCache, the consolidation and column
 * functions and _events_setup to the module. Returns -1 with an exception set on failure. */
int aprof_events_init(PyObject *module);

/* _csampler.c: add Sampler and the engine's functions to the module.
 * Returns -1 with an exception set on failure. */
int aprof_sampler_init(PyObject *module);

/* A suspended coroutine's or generator's code (borrowed) and instruction
 * offset (bytes, as frame.f_lasti), read from its frame in place: 1, or 0
 * when it is not suspended (then ask cr_code and cr_frame). In
 * _csampler.c, which reads CPython's frames. */
int aprof_gen_site(PyObject *gen, PyObject **code, int *lasti);
/* A coroutine's or generator's code in any state (borrowed; NULL: ask
 * cr_code), as cr_code reads it. In _csampler.c. */
PyObject *aprof_gen_code(PyObject *gen);
/* The user_site(cache, is_library) builtin's work (a new reference, None,
 * or NULL with an exception), and whether fn is that builtin: _ctasks.c
 * calls it directly for a new task's spawn site. */
PyObject *aprof_user_site(PyObject *cache, PyObject *is_library);
int aprof_is_user_site(PyObject *fn);
/* Whether contexts a and b hold the same variables, as one is a copy of
 * the other that neither has changed since (the same mapping: CPython's
 * contexts share it until one sets a variable). In _csampler.c. */
int aprof_same_context_vars(PyObject *a, PyObject *b);

/* _cblocks.c: a run of plain ranges of one scope, packed; see that file. */
typedef struct {
    PyObject *name;  /* str, owned */
    PyObject *args;  /* str or NULL, owned */
    PyObject *exc;   /* the name of the exception that ended it: str or NULL, owned */
    int64_t start;
    int64_t end;     /* BLOCK_OPEN until the range ends */
    int64_t end_tid; /* the id of the logical thread that ended it */
} BlockSlot;

typedef struct {
    PyObject_HEAD
    PyObject *scope; /* the scope value (a str) of every range in the block */
    Py_ssize_t n, cap;
    BlockSlot *slots;
    /* A block of a task's ranges in its generation's shared list of them
     * (TASK_BLOCKS, see _cranges.c): the task's logical thread id, and its
     * name, kind and OS thread id when the block was made (owned); 0 and
     * NULL in a logical thread's own list. */
    int64_t owner;
    PyObject *owner_name, *owner_kind, *owner_os_tid;
    Py_ssize_t at; /* an owned block's index in its list (where its task finds it again) */
} RangeBlock;

#define BLOCK_OPEN INT64_MIN

extern PyTypeObject RangeBlockType;
#define RangeBlock_Check(o) Py_IS_TYPE((o), &RangeBlockType)

/* A new empty block of `scope` ranges; NULL with an exception set. */
RangeBlock *aprof_block_new(PyObject *scope);
/* Make b the block of task `owner` (its id, name, kind and OS thread id:
 * references taken). */
void aprof_block_own(RangeBlock *b, int64_t owner, PyObject *name, PyObject *kind, PyObject *os_tid);
/* Take the next slot for a range named `name` (an exact str) with `args`
 * (an exact str or None), start 0 and open: the caller sets the start. The
 * slot's index, or -1 with an exception set. */
Py_ssize_t aprof_block_open(RangeBlock *b, PyObject *name, PyObject *args);
/* Slot i's range ends (ignored if it already has). `exc`: an exact str,
 * None or NULL. */
void aprof_block_close(RangeBlock *b, Py_ssize_t i, int64_t end, int64_t end_tid, PyObject *exc);
/* A profile's memory budget (issue 19): see _cblocks.c. */
typedef struct {
    PyObject_HEAD
    Py_ssize_t count;      /* records taken since the last call of on_full */
    Py_ssize_t limit;      /* on_full is called when count reaches it */
    int full;              /* keep the first: every later record is dropped */
    int in_full;           /* on_full is running */
    Py_ssize_t dropped[4]; /* dropped while full: ranges, instants, tasks, steps */
    PyObject *on_full;     /* called when count reaches limit: rotates the ring or fills the budget */
} Budget;

extern PyTypeObject BudgetType;
#define Budget_Check(o) Py_IS_TYPE((o), &BudgetType)
enum { BUDGET_RANGE = 0, BUDGET_INSTANT = 1, BUDGET_TASK = 2, BUDGET_STEP = 3 };
/* Take room for n records of `kind`: 0 record them, 1 drop them (counted),
 * -1 with a KeyboardInterrupt or SystemExit set (raised in on_full). */
int aprof_budget_take(Budget *b, int kind, Py_ssize_t n);

/* Add RangeBlock, Budget and the raw-list helpers to the module. Returns -1
 * with an exception set on failure. */
int aprof_blocks_init(PyObject *module);

/* _ctasks.c: a finished task's record, the TASK_RECORD_FIELDS of
 * aprof/_integrations/_tasks.py (its steps at TASK_RECORD_STEPS), in a
 * tuple's layout but no GC container (see there). */
#define TASK_RECORD_LEN 14
#define TASK_RECORD_STEPS 11
typedef struct {
    PyObject_HEAD
    PyObject *f[TASK_RECORD_LEN];
} TaskRecord;
extern PyTypeObject TaskRecordType;
/* A new TaskRecord of TASK_RECORD_LEN fields (references taken); NULL with
 * an exception set. */
PyObject *aprof_task_record(PyObject *const *f);
/* The fields of a finished task's record (borrowed): a TaskRecord, or the
 * pure-Python twin's tuple of TASK_RECORD_LEN; NULL for anything else (a
 * running task's TaskThread). */
static inline PyObject *const *
aprof_record_fields(PyObject *rec)
{
    if (Py_IS_TYPE(rec, &TaskRecordType))
        return ((TaskRecord *)rec)->f;
    if (PyTuple_CheckExact(rec) && PyTuple_GET_SIZE(rec) == TASK_RECORD_LEN)
        return &PyTuple_GET_ITEM(rec, 0);
    return NULL;
}

/* _cevents.c: take o (may be NULL) off the cyclic GC's lists if nothing it
 * refers to is on them but classes, the constants set by untrack_exempt
 * and the caller's `also` (n_also objects): plain data, which cannot be
 * part of a reference cycle. Given leaves first, a tree of it goes. Pass
 * only finished data: nothing re-checks a container appended to later. */
void aprof_untrack_if_acyclic(PyObject *o, PyObject *const *also, int n_also);

/* _cmemory.c: add the allocator hooks' functions to the module. Returns -1
 * with an exception set on failure. */
int aprof_memory_init(PyObject *module);
/* Let the calling thread's allocations pass the memory hooks unrecorded
 * (1), or as before (the value aprof_memory_quiet(1) returned): aprof's own
 * work done on the program's behalf, such as a sample's buffers. With the
 * GIL held. */
int aprof_memory_quiet(int quiet);

#endif
