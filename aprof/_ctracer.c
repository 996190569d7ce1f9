/*
 * aprof._ctracer: the Python tracer's hot path (SPEC 8.1).
 *
 * The contract is aprof/_ctracer.pyi; aprof/_core/_tracer_py.py is the
 * pure-Python twin with the same interface and the same packed format, and
 * aprof/_post/_replay.py turns the packed events into call trees at stop.
 *
 * Sections:
 *   1. Packed raw events      - 16 bytes each, one growable buffer
 *   2. The object table       - code objects, C function names and logical
 *                               threads seen, each once, by pointer
 *   3. Per-OS-thread slots    - thread index, its logical thread
 *   4. The per-event path     - context check (cached per context), logical
 *                               thread, push
 *   5. Event sources          - 3.11: a C profile function on every thread;
 *                               3.11 and 3.12 without C calls: a PEP 523
 *                               frame evaluator; 3.12+: C callables for
 *                               sys.monitoring
 *   6. The Tracer type and module
 *   7. Replay's inner loop    - the loop of aprof/_post/_replay.py, in C
 *
 * Everything runs with the GIL held (the profile function and sys.monitoring
 * callbacks are called with it), so the buffer needs no lock: events of all
 * threads interleave in one buffer in the order they happened.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <frameobject.h>
#include <stdint.h>
#include <string.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "_cext.h"

/* The layout of _PyInterpreterFrame is in CPython's internal headers, which
 * 3.11-3.13 install (Cython reads them the same way). Two things read it:
 * 3.11 and 3.12 without C calls evaluate frames through a PEP 523 hook,
 * which is handed one; and a method call's receiver (its first argument) is read
 * from the frame being entered (section 4). */
#define Py_BUILD_CORE 1
#include "internal/pycore_frame.h"
#undef Py_BUILD_CORE

#ifdef Py_GIL_DISABLED
/* The buffer and tables rely on the GIL (see above). On a free-threaded
 * build the extension is not built and aprof uses the pure-Python twin. */
#error "aprof._ctracer needs the GIL"
#endif

#if PY_VERSION_HEX >= 0x030C0000
#define APROF_MONITORING 1
#else
#define APROF_MONITORING 0
#endif

/* Without C calls, 3.11 and 3.12 record Python frames through a PEP 523
 * frame evaluator (section 5); 3.13 keeps sys.monitoring callbacks. */
#if PY_VERSION_HEX < 0x030D0000
#define APROF_EVAL 1
#else
#define APROF_EVAL 0
#endif

/* ------------------------------------------------------------------------ */
/* 1. Packed raw events                                                      */
/* ------------------------------------------------------------------------ */

/*
 * One raw event is two 64-bit words (16 bytes; viztracer keeps ~100 bytes an
 * event, the seed's profiler_python.cpp packs the same way):
 *
 *   word    bits  0-3   tag (EV_*)
 *           bits  4-15  thread index (which OS thread; 4096 of them)
 *           bits 16-31  reserved (0)
 *           bits 32-63  nanoseconds since the previous event in the buffer
 *   payload             EV_CALL..EV_CRAISE: index into the object table;
 *                       EV_SWITCH: object-table index of a logical thread;
 *                       EV_TIME: an absolute clock value
 *
 * A 32-bit delta covers 4.29 s; a longer gap first writes an EV_TIME event
 * with the absolute time. Events are appended on call *and* on return, as
 * they happen, so nothing per frame is kept in C: the call stacks are
 * rebuilt at stop (replay), which keeps the hot path a few stores.
 */
typedef struct {
    uint64_t word;
    uint64_t payload;
} RawEvent;

enum {
    EV_CALL = 1,     /* a Python frame starts or resumes */
    EV_RETURN = 2,   /* a Python frame returns or yields */
    EV_UNWIND = 3,   /* a Python frame exits by an exception */
    EV_CCALL = 4,    /* a C function is called */
    EV_CRETURN = 5,  /* it returned */
    EV_CRAISE = 6,   /* it raised */
    EV_SWITCH = 7,   /* this OS thread now runs another logical thread */
    EV_TIME = 8,     /* absolute time (after a gap the delta cannot hold) */
    EV_EXC = 9,      /* the exception type of the UNWIND that follows (3.12+, and
                        3.11 without C calls: every source but 3.11's
                        profile function) */
    EV_RECV = 10,    /* the receiver of the method CALL that follows: payload =
                        object index of its class (or, with instance_ids, of a
                        (class, serial) description); see section 4 */
};

#define MAX_THREADS 4096
/* keep_latest (a ring): the buffer is this many segments, the one being
 * written and the sealed ones; when the one being written is full and all
 * are in use, the oldest is let go (see ring_rotate). */
#define RING_SEGS 8
/* Events a segment has room for past its limit: a rotation's header (TIME,
 * SWITCH, a RECV or EXC carried over) and push's TIME and event. */
#define RING_SLACK 8
/* Object-table values: the index, and flags decided at first sight. */
#define IGNORED_FLAG ((uint32_t)1 << 31) /* aprof's own code: not recorded */
#define METHOD_FLAG ((uint32_t)1 << 30)  /* a method: its first argument is `self` */
#define CLS_FLAG ((uint32_t)1 << 29)     /* a classmethod: its first argument is `cls` */
#define IDX_MASK (((uint32_t)1 << 29) - 1)

/*
 * The event buffer's memory. A traced second writes tens of megabytes of
 * events, and each fresh 4 KiB page costs a kernel fault on first touch: on
 * this project's VMs 25k faults and ~65 ms of system time for fib(30)'s
 * 3.2M events, more than half of what the evaluator's own instructions
 * cost. So on Linux a buffer of 1 MiB or more is an anonymous mapping that
 * asks for transparent huge pages (MADV_HUGEPAGE: one fault per 2 MiB where
 * the kernel has them, 4 KiB pages where not), and grows with mremap, which
 * moves page tables instead of copying. Smaller buffers (small rings'
 * segments) stay with PyMem. The size decides the kind, so every free and
 * resize passes the buffer's size in events. Either way a memory profile
 * does not charge the buffer to the program's code (a mapping is outside
 * PyMem, and a small one is allocated quietly), and a mapping is not
 * counted by tracemalloc.
 */
#if defined(__linux__)
#include <sys/mman.h>
#define BUF_MAPPED(bytes) ((bytes) >= ((size_t)1 << 20))
#else
#define BUF_MAPPED(bytes) 0
#endif

static RawEvent *
buf_alloc(Py_ssize_t n)
{
    size_t bytes = (size_t)Py_MAX(n, 1) * sizeof(RawEvent);
#if defined(__linux__)
    if (BUF_MAPPED(bytes)) {
        void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED)
            return NULL;
#ifdef MADV_HUGEPAGE
        (void)madvise(p, bytes, MADV_HUGEPAGE); /* advice: failure changes nothing */
#endif
        return (RawEvent *)p;
    }
#endif
    int quiet = aprof_memory_quiet(1); /* aprof's own: not the program's allocation */
    RawEvent *buf = PyMem_Malloc(bytes);
    aprof_memory_quiet(quiet);
    return buf;
}

static void
buf_free(RawEvent *buf, Py_ssize_t n)
{
    if (buf == NULL)
        return;
#if defined(__linux__)
    size_t bytes = (size_t)Py_MAX(n, 1) * sizeof(RawEvent);
    if (BUF_MAPPED(bytes)) {
        munmap(buf, bytes);
        return;
    }
#endif
    PyMem_Free(buf);
}

/* buf (n events, NULL when n is 0) resized to m events, its first
 * min(n, m) kept; NULL without memory (buf is then left as it was). */
static RawEvent *
buf_resize(RawEvent *buf, Py_ssize_t n, Py_ssize_t m)
{
    if (buf == NULL)
        return buf_alloc(m);
#if defined(__linux__) && defined(MREMAP_MAYMOVE)
    size_t old = (size_t)Py_MAX(n, 1) * sizeof(RawEvent), new = (size_t)Py_MAX(m, 1) * sizeof(RawEvent);
    if (BUF_MAPPED(old) && BUF_MAPPED(new)) {
        void *p = mremap(buf, old, new, MREMAP_MAYMOVE);
        if (p == MAP_FAILED)
            return NULL;
#ifdef MADV_HUGEPAGE
        (void)madvise(p, new, MADV_HUGEPAGE);
#endif
        return (RawEvent *)p;
    }
#endif
    RawEvent *fresh = buf_alloc(m);
    if (fresh == NULL)
        return NULL;
    memcpy(fresh, buf, (size_t)Py_MIN(n, m) * sizeof(RawEvent));
    buf_free(buf, n);
    return fresh;
}

/*
 * The event clock. Reading CLOCK_MONOTONIC costs ~20 ns here (vDSO), two
 * reads per call; the CPU's time-stamp counter costs ~7 ns. Where the TSC is
 * invariant (constant_tsc and nonstop_tsc: same rate on every core, in every
 * power state, which Linux then also syncs across cores), events carry TSC
 * ticks and the tracer records (ticks, ns) at start and at stop; replay maps
 * ticks to perf_counter_ns linearly. Elsewhere events carry nanoseconds.
 */
#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#define APROF_HAVE_TSC 1
#else
#define APROF_HAVE_TSC 0
#endif
static int use_tsc = 0;

static APROF_INLINE uint64_t
now_ticks(void)
{
#if APROF_HAVE_TSC
    if (use_tsc)
        return __rdtsc();
#endif
    return now_ns();
}

static void
detect_tsc(void)
{
#if APROF_HAVE_TSC && defined(__linux__)
    if (getenv("APROF_NO_TSC") != NULL)
        return;
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f == NULL)
        return;
    char line[4096];
    int constant = 0, nonstop = 0;
    while (fgets(line, sizeof line, f) != NULL) {
        if (strncmp(line, "flags", 5) != 0)
            continue;
        constant = strstr(line, " constant_tsc") != NULL;
        nonstop = strstr(line, " nonstop_tsc") != NULL;
        break;
    }
    fclose(f);
    use_tsc = constant && nonstop;
#endif
}

/* One (ticks, ns) calibration pair. Reading the two clocks one after the
 * other is only a pair if nothing ran in between: a thread preempted there
 * (a loaded machine) would shift every tracer time against the ranges' by
 * the length of the preemption. So the ns read is bracketed by two tick
 * reads, a few times, and the tightest bracket wins, its midpoint standing
 * for the ns read. */
static void
read_pair(uint64_t *ticks, uint64_t *ns)
{
    uint64_t best = UINT64_MAX;
    *ticks = now_ticks();
    *ns = now_ns();
    if (!use_tsc)
        return; /* both are the same clock */
    for (int i = 0; i < 16; i++) {
        uint64_t a = now_ticks(), n = now_ns(), b = now_ticks();
        if (b >= a && b - a < best) {
            best = b - a;
            *ticks = a + (b - a) / 2;
            *ns = n;
        }
    }
}

/* ------------------------------------------------------------------------ */
/* 2. The object table: pointer -> index, open addressing                    */
/* ------------------------------------------------------------------------ */

typedef struct {
    void *key;
    uint32_t value; /* index into objs, with IGNORED_FLAG for aprof's own code */
} Slot;

typedef struct {
    int tidx;              /* this thread's index */
    unsigned long ident;   /* threading.get_ident() of the thread */
    int32_t own_lt;        /* object index of the thread's own logical thread, -1 until needed */
    int32_t cur_lt;        /* logical thread of the last event written, -1 none */
    PyObject *last_vars;   /* the context variables (HAMT) the cache below is for */
    int last_in;           /* is that context recorded? */
    int32_t last_lt;       /* and which logical thread owns it */
} ThreadSlot;

typedef struct {
    PyObject_HEAD
    /* configuration */
    PyObject *rf_var;        /* ContextVar RF_STATE */
    PyObject *recorder;      /* the profile's Recorder; None: record everything */
    PyObject *lt_var;        /* ContextVar holding (LogicalThread, ident) or None */
    PyObject *thread_lt;     /* () -> the OS thread's own LogicalThread */
    PyObject *ignore_prefix; /* str: code whose file starts with it is not recorded */
    Py_ssize_t max_events;   /* 0: unbounded */
    int global;
    int active;
    uint64_t gen;            /* distinguishes this tracer's thread-local marks */
    /* identity cache of the context check (strong references, so no ABA) */
    PyObject *pos;
    PyObject *neg;
    /* events */
    RawEvent *buf;
    Py_ssize_t len, cap;
    Py_ssize_t limit;           /* push's slow path from this length (see set_limit) */
    uint64_t last_ns, start_ns; /* in event clock units (see now_ticks) */
    uint64_t calib[4];          /* ticks and ns at start, ticks and ns at stop */
    Py_ssize_t dropped;
    /* keep_latest: a ring of RING_SEGS segments of seg_cap events each. buf
     * is the one being written; segs[0..nsegs) the sealed ones, oldest
     * first, seg_len their lengths and seg_head how many of their first
     * events a rotation wrote (not the program's: not counted when let go). */
    int ring;
    int nsegs;
    int let_go;                 /* a segment was let go: replay needs the prologue */
    int head;                   /* the header events of buf */
    Py_ssize_t seg_cap;
    Py_ssize_t held;            /* events in the sealed segments */
    RawEvent *segs[RING_SEGS];
    Py_ssize_t seg_len[RING_SEGS];
    int seg_head[RING_SEGS];
    /* object table */
    PyObject *objs;          /* list */
    Slot *table;
    size_t table_size, table_used;
    /* threads */
    ThreadSlot *threads;
    int nthreads;
    PyObject *prev_thread_hook;
    int installed_311;
    int c_calls;             /* record C calls (else Python frames only) */
    /* method receivers (section 4): per object index, the receiver
     * description first written for that code (+1; 0: none yet) */
    uint32_t *recv_first;
    Py_ssize_t recv_cap;
    int instance_ids;        /* describe receivers per instance, not per class */
    struct InstSlot *inst;   /* instance_ids: instance pointer -> description */
    size_t inst_size, inst_used;
    PyObject *serials;       /* instance_ids: class -> next serial (dict) */
    int use_eval;            /* records Python frames through the frame evaluator */
#if APROF_EVAL
    /* 3.11 and 3.12 without C calls: the frame evaluator (see section 5) */
    int eval_installed;
    struct LiveFrame *live;  /* frames live at start, outermost first */
    Py_ssize_t nlive;
    PyThreadState *live_tstate;
    int32_t live_lt;
    int degraded;            /* the C stack ran low: switched to the profile function (3.11)
                                or to sys.monitoring callbacks (3.12) */
    uint64_t eval_gen;       /* gen while the evaluator records (installed and active), else
                                EVAL_OFF: what the evaluator's fast path checks (section 5) */
#endif
} Tracer;

#if APROF_EVAL
#define EVAL_OFF UINT64_MAX
#endif

static uint64_t next_gen = 1;
/* Which thread slot this OS thread has in the running tracer. */
static APROF_TLS uint64_t tl_gen = 0;
static APROF_TLS int tl_tidx = 0;
static PyObject *str_recorder;
static PyObject *str_enabled;
static PyObject *str_locals_tail;
static PyObject *str_co_filename;
static Tracer *running_tracer = NULL; /* at most one at a time */

#if APROF_EVAL
/* running_tracer's eval_gen, or EVAL_OFF without one: the evaluator's fast
 * path reads this one word for "which tracer, recording through the
 * evaluator". eval_sync() follows every change of either. */
static uint64_t running_eval_gen = EVAL_OFF;

static void
eval_sync(void)
{
    running_eval_gen = running_tracer != NULL ? running_tracer->eval_gen : EVAL_OFF;
}
#endif

static int
table_grow(Tracer *t)
{
    size_t n = t->table_size ? t->table_size * 2 : 1024;
    Slot *nt = PyMem_Calloc(n, sizeof(Slot));
    if (nt == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (size_t i = 0; i < t->table_size; i++) {
        Slot *s = &t->table[i];
        if (s->key == NULL)
            continue;
        size_t j = hash_ptr(s->key, n - 1);
        while (nt[j].key != NULL)
            j = (j + 1) & (n - 1);
        nt[j] = *s;
    }
    PyMem_Free(t->table);
    t->table = nt;
    t->table_size = n;
    return 0;
}

/* Index of obj under key, adding it on first sight (desc is what is kept:
 * the code object itself, or a description of a C function). Returns -1 on
 * error. */
static int64_t
table_add(Tracer *t, void *key, PyObject *desc, uint32_t flags)
{
    if ((t->table_used + 1) * 2 > t->table_size && table_grow(t) < 0)
        return -1;
    Py_ssize_t idx = PyList_GET_SIZE(t->objs);
    if (PyList_Append(t->objs, desc) < 0)
        return -1;
    if ((size_t)idx > IDX_MASK) {
        PyErr_SetString(PyExc_OverflowError, "aprof tracer: too many distinct objects");
        return -1;
    }
    uint32_t value = (uint32_t)idx | flags;
    size_t j = hash_ptr(key, t->table_size - 1);
    while (t->table[j].key != NULL)
        j = (j + 1) & (t->table_size - 1);
    t->table[j].key = key;
    t->table[j].value = value;
    t->table_used++;
    return value;
}

static APROF_INLINE int64_t
table_get(Tracer *t, void *key)
{
    if (t->table_size == 0)
        return -2;
    size_t mask = t->table_size - 1;
    size_t j = hash_ptr(key, mask);
    for (;;) {
        Slot *s = &t->table[j];
        if (s->key == key)
            return s->value;
        if (s->key == NULL)
            return -2;
        j = (j + 1) & mask;
    }
}

/* The index of an object kept as itself (a logical thread, an exception
 * type), added on first sight. Returns -1 on error. */
static int64_t
obj_index(Tracer *t, PyObject *obj)
{
    int64_t v = table_get(t, obj);
    return v != -2 ? v : table_add(t, obj, obj, 0);
}

/* Is this code a method (first argument `self`: METHOD_FLAG) or a
 * classmethod (`cls`: CLS_FLAG) defined in a class body? Its qualified name
 * has a class part (not "<locals>") before the function's own name. */
static uint32_t
method_flags(PyObject *code)
{
    PyCodeObject *co = (PyCodeObject *)code;
    if (co->co_argcount < 1)
        return 0;
    uint32_t flags = 0;
    PyObject *names = PyObject_GetAttrString(code, "co_varnames");
    if (names == NULL) {
        PyErr_Clear();
        return 0;
    }
    if (PyTuple_Check(names) && PyTuple_GET_SIZE(names) > 0) {
        PyObject *first = PyTuple_GET_ITEM(names, 0);
        if (PyUnicode_Check(first)) {
            if (PyUnicode_CompareWithASCIIString(first, "self") == 0)
                flags = METHOD_FLAG;
            else if (PyUnicode_CompareWithASCIIString(first, "cls") == 0)
                flags = CLS_FLAG;
        }
    }
    Py_DECREF(names);
    if (flags) {
        PyObject *qn = co->co_qualname;
        Py_ssize_t dot = PyUnicode_FindChar(qn, '.', 0, PyUnicode_GET_LENGTH(qn), -1);
        int ok = dot > 0;
        if (ok) {
            PyObject *owner = PyUnicode_Substring(qn, 0, dot);
            ok = owner != NULL && PyUnicode_Tailmatch(owner, str_locals_tail, 0, PY_SSIZE_T_MAX, 1) == 0;
            Py_XDECREF(owner);
            PyErr_Clear();
        }
        if (!ok)
            flags = 0;
    }
    return flags;
}

/* A code object's first sight decides whether it is aprof's own, and
 * whether it is a method. */
static APROF_NOINLINE int64_t
code_index_add(Tracer *t, PyObject *code)
{
    uint32_t flags = 0;
    PyObject *fn = PyObject_GetAttr(code, str_co_filename);
    if (fn == NULL)
        return -1;
    if (PyUnicode_Check(fn) && PyUnicode_GET_LENGTH(t->ignore_prefix) > 0) {
        int r = PyUnicode_Tailmatch(fn, t->ignore_prefix, 0, PY_SSIZE_T_MAX, -1);
        if (r < 0) {
            Py_DECREF(fn);
            return -1;
        }
        if (r)
            flags = IGNORED_FLAG;
    }
    Py_DECREF(fn);
    if (!flags)
        flags = method_flags(code);
    return table_add(t, code, code, flags);
}

/* A code object's index (with IGNORED_FLAG for aprof's own code). */
static APROF_INLINE int64_t
code_index(Tracer *t, PyObject *code)
{
    int64_t v = table_get(t, code);
    return v != -2 ? v : code_index_add(t, code);
}

/* The key of a C callable: its PyMethodDef, which is static, so a bound
 * method made per call (lst.append) maps to one entry. Only builtin
 * functions and method descriptors are recorded as C calls. */
static APROF_INLINE void *
cfunc_key(PyObject *callable)
{
    PyTypeObject *tp = Py_TYPE(callable);
    if (tp == &PyCFunction_Type || tp == &PyCMethod_Type)
        return ((PyCFunctionObject *)callable)->m_ml;
    if (tp == &PyMethodDescr_Type)
        return ((PyMethodDescrObject *)callable)->d_method;
    if (tp == &PyFunction_Type || tp == &PyType_Type)
        return NULL; /* the common misses, without the subtype walk below */
    if (PyCFunction_Check(callable))
        return ((PyCFunctionObject *)callable)->m_ml;
    if (Py_IS_TYPE(callable, &PyMethodDescr_Type))
        return ((PyMethodDescrObject *)callable)->d_method;
    return NULL;
}

/* Is this PyMethodDef one of an aprof C type's methods (record_function's
 * __enter__/__exit__ on RangeCore, ...)? Those are aprof's bookkeeping, as
 * its Python frames are, and are not recorded as the program's C calls.
 * tp is the receiver's type (a bound method) or the descriptor's class. */
static int
is_aprof_method(PyTypeObject *tp, PyMethodDef *ml)
{
    PyObject *mro = tp->tp_mro;
    Py_ssize_t n = mro != NULL && PyTuple_Check(mro) ? PyTuple_GET_SIZE(mro) : 0;
    for (Py_ssize_t i = -1; i < n; i++) {
        PyTypeObject *base = i < 0 ? tp : (PyTypeObject *)PyTuple_GET_ITEM(mro, i);
        if ((base->tp_flags & Py_TPFLAGS_HEAPTYPE) || base->tp_methods == NULL
            || strncmp(base->tp_name, "aprof.", 6) != 0)
            continue;
        for (PyMethodDef *m = base->tp_methods; m->ml_name != NULL; m++)
            if (m == ml)
                return 1;
    }
    return 0;
}

static APROF_NOINLINE int64_t
cfunc_index_add(Tracer *t, PyObject *callable, void *key)
{
    int own = 0;
    if (PyCFunction_Check(callable)) {
        PyObject *self = PyCFunction_GET_SELF(callable);
        own = self != NULL && is_aprof_method(Py_TYPE(self), (PyMethodDef *)key);
    }
    else if (Py_IS_TYPE(callable, &PyMethodDescr_Type)) {
        own = is_aprof_method(((PyDescrObject *)callable)->d_type, (PyMethodDef *)key);
    }
    /* First sight: keep a (name, file, line) description, not the object,
     * so a bound method does not keep its receiver alive. */
    PyObject *qn = PyObject_GetAttrString(callable, "__qualname__");
    if (qn == NULL) {
        PyErr_Clear();
        qn = PyUnicode_FromString(((PyMethodDef *)key)->ml_name);
        if (qn == NULL)
            return -1;
    }
    PyObject *desc = Py_BuildValue("(Nsi)", qn, "<built-in>", 0);
    if (desc == NULL)
        return -1;
    int64_t r = table_add(t, key, desc, own ? IGNORED_FLAG : 0);
    Py_DECREF(desc);
    return r;
}

static APROF_INLINE int64_t
cfunc_index(Tracer *t, PyObject *callable, void *key)
{
    int64_t v = table_get(t, key);
    return v != -2 ? v : cfunc_index_add(t, callable, key);
}

/* ------------------------------------------------------------------------ */
/* 3. Per-OS-thread slots                                                    */
/* ------------------------------------------------------------------------ */

/* A slot is made the first time a thread sees an event while the tracer
 * runs; its own logical thread is looked up (a Python call) only when it
 * first records. Past MAX_THREADS new threads are not recorded (counted in
 * dropped), never an error. */
static ThreadSlot *
new_thread_slot(Tracer *t)
{
    if (t->nthreads >= MAX_THREADS)
        return NULL;
    ThreadSlot *ts = PyMem_Realloc(t->threads, sizeof(ThreadSlot) * (t->nthreads + 1));
    if (ts == NULL)
        return NULL;
    t->threads = ts;
    ThreadSlot *s = &ts[t->nthreads];
    memset(s, 0, sizeof *s);
    s->tidx = t->nthreads;
    s->ident = PyThread_get_thread_ident();
    s->own_lt = -1;
    s->cur_lt = -1;
    s->last_lt = -1;
    tl_gen = t->gen;
    tl_tidx = t->nthreads;
    t->nthreads++;
    return s;
}

static APROF_INLINE ThreadSlot *
thread_slot(Tracer *t)
{
    if (tl_gen == t->gen)
        return &t->threads[tl_tidx];
    return new_thread_slot(t);
}

static int32_t
own_lt(Tracer *t, ThreadSlot *ts)
{
    if (ts->own_lt >= 0)
        return ts->own_lt;
    PyObject *lt = PyObject_CallNoArgs(t->thread_lt);
    if (lt == NULL)
        return -1;
    if (lt == Py_None) { /* a thread still starting up: not recorded yet */
        Py_DECREF(lt);
        return -2;
    }
    int64_t idx = obj_index(t, lt);
    Py_DECREF(lt);
    if (idx < 0)
        return -1;
    /* thread_lt() ran Python code: another thread may have grown t->threads,
     * so the slot is found again by index. */
    t->threads[tl_tidx].own_lt = (int32_t)idx;
    return (int32_t)idx;
}

/* ------------------------------------------------------------------------ */
/* 4. The per-event path                                                     */
/* ------------------------------------------------------------------------ */

/*
 * Two questions per event, both about the running context: is it the
 * profiled one (RF_STATE's recorder is ours), and which logical thread owns
 * it (TRACER_LT)? Both answers change only when the context's variables
 * change, and a context's variables are an immutable HAMT that is replaced
 * on every ContextVar.set. So each thread slot caches the answers under the
 * identity of the running context's HAMT (held strongly, so its address
 * cannot be reused): the common event costs three pointer loads and a
 * compare, with no PyContextVar_Get and no Python call (pyinstrument
 * compares a ContextVar's value the same way).
 */
#if PY_VERSION_HEX < 0x030E0000
/* The head of CPython's struct _pycontextobject
 * (Include/internal/pycore_context.h), the same in 3.11, 3.12 and 3.13. */
typedef struct {
    PyObject_HEAD
    PyObject *ctx_prev;
    PyObject *ctx_vars;
} ContextHead;
#define APROF_CONTEXT_VARS 1
#else
#define APROF_CONTEXT_VARS 0
#endif

/* The variables of the context thread tstate runs. */
static APROF_INLINE PyObject *
context_vars_of(PyThreadState *tstate)
{
#if APROF_CONTEXT_VARS
    PyObject *ctx = tstate->context;
    return ctx != NULL ? ((ContextHead *)ctx)->ctx_vars : NULL;
#else
    (void)tstate;
    return NULL;
#endif
}

static APROF_INLINE PyObject *
context_vars(void)
{
#if APROF_CONTEXT_VARS
#if PY_VERSION_HEX >= 0x030D0000
    return context_vars_of(PyThreadState_GetUnchecked());
#else
    return context_vars_of(_PyThreadState_UncheckedGet());
#endif
#else
    return NULL;
#endif
}

/* The RFState in RF_STATE is shared by every task spawned from the profiled
 * context, so its own identity cache (accepted / rejected) mostly hits. A
 * context is recorded when recording is on there (SPEC 3.4: nothing records
 * under DisableRecordFunctionGuard) and, in context scope, its recorder is
 * the profile's. Both are fields of the immutable RFState, so the answer is
 * cached with it: the switch costs nothing per call, only at the context
 * change (a task step, a guard's enter or exit) that brings a new RFState. */
static int
classify(Tracer *t, PyObject *state)
{
    int ok = 0;
    PyObject *en = PyObject_GetAttr(state, str_enabled);
    if (en == NULL) {
        PyErr_Clear();
    }
    else {
        ok = PyObject_IsTrue(en);
        Py_DECREF(en);
        if (ok < 0) {
            PyErr_Clear();
            ok = 0;
        }
    }
    if (ok && !t->global) {
        PyObject *rec = PyObject_GetAttr(state, str_recorder);
        if (rec == NULL) {
            PyErr_Clear();
            ok = 0;
        }
        else {
            ok = rec == t->recorder;
            Py_DECREF(rec);
        }
    }
    PyObject **slot = ok ? &t->pos : &t->neg;
    Py_INCREF(state);
    Py_XSETREF(*slot, state);
    return ok;
}

static int
in_context(Tracer *t)
{
    PyObject *v = NULL;
    if (PyContextVar_Get(t->rf_var, NULL, &v) < 0) {
        PyErr_Clear();
        return 0;
    }
    int ok;
    if (v == NULL)
        ok = t->global; /* no RFState: recording is on, no context profile */
    else if (v == t->pos)
        ok = 1;
    else if (v == t->neg)
        ok = 0;
    else
        ok = classify(t, v);
    Py_XDECREF(v);
    return ok;
}

/* Tasks publish (LogicalThread, os ident) in TRACER_LT in their own context
 * when their first step starts. A value from another OS thread (a context
 * copied into to_thread or aprof.wrap) means the thread's own track. */
static int32_t
context_lt(Tracer *t, ThreadSlot *ts)
{
    PyObject *v = NULL;
    if (PyContextVar_Get(t->lt_var, NULL, &v) < 0) {
        PyErr_Clear();
        v = NULL;
    }
    int32_t lt = -1;
    if (v != NULL && PyTuple_Check(v) && PyTuple_GET_SIZE(v) == 2) {
        unsigned long ident = PyLong_AsUnsignedLong(PyTuple_GET_ITEM(v, 1));
        if (ident == (unsigned long)-1 && PyErr_Occurred())
            PyErr_Clear();
        else if (ident == ts->ident) {
            int64_t idx = obj_index(t, PyTuple_GET_ITEM(v, 0));
            if (idx < 0)
                PyErr_Clear();
            else
                lt = (int32_t)idx;
        }
    }
    Py_XDECREF(v);
    return lt >= 0 ? lt : own_lt(t, ts);
}

/* Is this event's context recorded? Sets ts->last_lt when it is. Returns
 * -1 on error (the slot pointer may be stale after it: callers re-fetch). */
static int
context_check(Tracer *t, ThreadSlot *ts)
{
    PyObject *vars = context_vars();
    if (vars != NULL && vars == ts->last_vars)
        return ts->last_in;
    int in = in_context(t);
    int32_t lt = -1;
    if (in) {
        int tidx = ts->tidx;
        lt = context_lt(t, ts);
        ts = &t->threads[tidx];
        if (lt == -2)
            return 0; /* not cached: asked again at the next event */
        if (lt < 0)
            return -1;
    }
    Py_XINCREF(vars);
    Py_XSETREF(ts->last_vars, vars);
    ts->last_in = in;
    ts->last_lt = lt;
    return in;
}

static int
grow(Tracer *t)
{
    Py_ssize_t n = t->cap ? t->cap * 2 : 65536;
    if (t->max_events && n > t->max_events + 2)
        n = t->max_events + 2;
    if (n <= t->cap)
        return -1;
    RawEvent *nb = buf_resize(t->buf, t->cap, n);
    if (nb == NULL)
        return -1;
    t->buf = nb;
    t->cap = n;
    return 0;
}

/* The length from which push() takes its slow path: room for two more
 * events (a TIME and the event), and below max_events when bounded. */
static void
set_limit(Tracer *t)
{
    Py_ssize_t limit = t->cap - 1;
    if (t->max_events && t->max_events < limit)
        limit = t->max_events;
    t->limit = limit;
}

/* The events of a segment the program's calls wrote: all but clock events
 * and the rotation's header. */
static Py_ssize_t
ring_events(const RawEvent *seg, Py_ssize_t len, int head)
{
    Py_ssize_t n = 0;
    for (Py_ssize_t i = head; i < len; i++)
        n += (seg[i].word & 15) != EV_TIME;
    return n;
}

/* keep_latest: the segment being written is full. Seal it and start the
 * next, in the memory of the oldest (let go, its events counted in
 * dropped) once all RING_SEGS are in use: whole segments go, oldest first,
 * so the ring holds between 7/8 and all of max_events, and a rotation
 * costs a count of the segment let go, no copy.
 *
 * A segment must read on its own once those before it are gone, so the
 * next one starts with a header: a TIME (the clock), the SWITCH of the
 * thread writing now (every other thread writes its own again before its
 * next event), and the RECV or EXC that ended the sealed one (it belongs
 * to the event being written). Calls whose start was let go leave returns
 * that replay skips. tidx: the thread writing. 0 when nothing can be
 * recorded (no memory): the event is dropped. */
static APROF_NOINLINE int
ring_rotate(Tracer *t, int tidx)
{
    Py_ssize_t seg_events = t->seg_cap + RING_SLACK;
    if (t->buf == NULL) {
        if ((t->buf = buf_alloc(seg_events)) == NULL) {
            t->dropped++;
            return 0;
        }
        t->cap = t->seg_cap + RING_SLACK;
        t->limit = t->seg_cap;
        return 1;
    }
    RawEvent *fresh;
    if (t->nsegs == RING_SEGS - 1) {
        fresh = t->segs[0];
        t->dropped += ring_events(fresh, t->seg_len[0], t->seg_head[0]);
        t->held -= t->seg_len[0];
        t->let_go = 1;
        t->nsegs--;
        memmove(t->segs, t->segs + 1, (size_t)t->nsegs * sizeof(t->segs[0]));
        memmove(t->seg_len, t->seg_len + 1, (size_t)t->nsegs * sizeof(t->seg_len[0]));
        memmove(t->seg_head, t->seg_head + 1, (size_t)t->nsegs * sizeof(t->seg_head[0]));
    }
    else if ((fresh = buf_alloc(seg_events)) == NULL) {
        t->dropped++;
        return 0;
    }
    RawEvent *old = t->buf;
    Py_ssize_t old_len = t->len;
    t->segs[t->nsegs] = old;
    t->seg_len[t->nsegs] = old_len;
    t->seg_head[t->nsegs] = t->head;
    t->nsegs++;
    t->held += old_len;
    Py_ssize_t n = 0;
    fresh[n].word = EV_TIME;
    fresh[n++].payload = t->last_ns;
    for (int i = 0; i < t->nthreads; i++) {
        if (i != tidx)
            t->threads[i].cur_lt = -1;
    }
    if (tidx >= 0 && tidx < t->nthreads && t->threads[tidx].cur_lt >= 0) {
        fresh[n].word = (uint64_t)EV_SWITCH | ((uint64_t)tidx << 4);
        fresh[n++].payload = (uint64_t)t->threads[tidx].cur_lt;
    }
    if (old_len > 0) {
        int tag = (int)(old[old_len - 1].word & 15);
        if (tag == EV_RECV || tag == EV_EXC) {
            fresh[n].word = old[old_len - 1].word & 0xFFFFFFFFu;
            fresh[n++].payload = old[old_len - 1].payload;
        }
    }
    t->buf = fresh;
    t->len = n;
    t->head = (int)n;
    t->limit = t->seg_cap;
    return 1;
}

/* Is there room for one more event (and the TIME before it)? Bounded
 * buffers stop recording when full: the events kept are the first
 * max_events, the rest are counted in dropped; a ring rotates. */
static APROF_NOINLINE int
make_room(Tracer *t, int tidx)
{
    if (t->ring)
        return ring_rotate(t, tidx);
    if ((t->max_events && t->len >= t->max_events) || (t->len + 2 > t->cap && grow(t) < 0)) {
        t->dropped++;
        return 0;
    }
    set_limit(t);
    return 1;
}

/* Append one event. */
static APROF_INLINE void
push(Tracer *t, int tag, int tidx, uint64_t payload, uint64_t now)
{
    if (t->len >= t->limit && !make_room(t, tidx))
        return;
    uint64_t delta = now > t->last_ns ? now - t->last_ns : 0;
    if (delta >> 32) {
        RawEvent *e = &t->buf[t->len++];
        e->word = EV_TIME;
        e->payload = now;
        delta = 0;
    }
    t->last_ns = now;
    RawEvent *e = &t->buf[t->len++];
    e->word = (uint64_t)tag | ((uint64_t)tidx << 4) | (delta << 32);
    e->payload = payload;
}

static void
fail(Tracer *t)
{
    /* A tracer that cannot record is switched off, never raised into the
     * user's code: the profile keeps what it has. */
    t->active = 0;
#if APROF_EVAL
    t->eval_gen = EVAL_OFF;
    eval_sync();
#endif
    if (PyErr_Occurred())
        PyErr_WriteUnraisable((PyObject *)t);
}

/* Write one event (object-table entry idx) for the thread in slot tidx,
 * preceded by a SWITCH when its logical thread changed. */
static APROF_INLINE void
write_event(Tracer *t, int tidx, int tag, int64_t idx, uint64_t now)
{
    ThreadSlot *ts = &t->threads[tidx];
    int32_t lt = ts->last_lt;
    if (lt != ts->cur_lt) {
        ts->cur_lt = lt;
        push(t, EV_SWITCH, tidx, (uint64_t)lt, now);
    }
    push(t, tag, tidx, (uint64_t)idx, now);
}

/* recording_slot() when the cached answer does not apply: a new thread, or
 * a context not seen since the last event of this thread. */
static APROF_NOINLINE ThreadSlot *
recording_slot_slow(Tracer *t)
{
    ThreadSlot *ts = thread_slot(t);
    if (ts == NULL) {
        t->dropped++;
        return NULL;
    }
    int tidx = ts->tidx;
    int in = context_check(t, ts);
    if (in < 0) {
        fail(t);
        return NULL;
    }
    return in ? &t->threads[tidx] : NULL;
}

/* The slot of this thread if the event is to be recorded, else NULL. The
 * common case: the thread has its slot and runs the context of its last
 * event, whose answer is cached. */
static APROF_INLINE ThreadSlot *
recording_slot(Tracer *t)
{
    if (APROF_UNLIKELY(!t->active))
        return NULL;
    if (APROF_LIKELY(tl_gen == t->gen)) {
        ThreadSlot *ts = &t->threads[tl_tidx];
        PyObject *vars = context_vars();
        if (APROF_LIKELY(vars != NULL && vars == ts->last_vars))
            return ts->last_in ? ts : NULL;
    }
    return recording_slot_slow(t);
}

/* recording_slot() for a caller that has the thread state at hand (the
 * frame evaluator): 3.12's thread-state lookup is a call. */
static APROF_INLINE ThreadSlot *
recording_slot_of(Tracer *t, PyThreadState *tstate)
{
    if (APROF_UNLIKELY(!t->active))
        return NULL;
    if (APROF_LIKELY(tl_gen == t->gen)) {
        ThreadSlot *ts = &t->threads[tl_tidx];
        PyObject *vars = context_vars_of(tstate);
        if (APROF_LIKELY(vars != NULL && vars == ts->last_vars))
            return ts->last_in ? ts : NULL;
    }
    return recording_slot_slow(t);
}

/* What on_code() and on_cfunc() return for an event of aprof's own code (a
 * C call made by it), which is never recorded: on 3.12+ its location can
 * be switched off. Otherwise they return 0; they never fail (see fail()). */
#define OWN_CODE 1

/*
 * Method receivers (issue 15 item 8). A method's code is shared by every
 * class that inherits it and every instance, so `Module.__call__` alone does
 * not say which module ran. A CALL of a method (first argument `self`) or a
 * classmethod (`cls`) is preceded by an EV_RECV naming the receiver's class
 * (the class itself for `cls`), or with instance_ids a (class, serial)
 * description of the instance, numbered per class in order of first sight
 * (the seed's module attribution, `Linear_0`).
 *
 * Most methods are called on one class only, so the receiver written first
 * for a code is its default: later CALLs of that code with the same
 * receiver carry no EV_RECV, and replay applies the default (the first
 * EV_RECV of the code in the buffer, which is this one: the buffer is in
 * time order and a bounded buffer stops, never wraps). The common call
 * costs a load of the frame's first local and a compare.
 *
 * Instances are keyed by address without a reference (recording never
 * keeps a user's object alive, SPEC 12/15.6); a weak reference tells a live
 * instance from a new one at a reused address. An instance that cannot be
 * weakly referenced is described by its class.
 */
struct InstSlot {
    void *key;     /* the instance's address */
    PyObject *wr;  /* a weak reference to it */
    uint32_t idx;  /* object index of its (class, serial) */
};

static APROF_INLINE PyObject *
frame_receiver(struct _PyInterpreterFrame *f)
{
    PyObject *r = f->localsplus[0];
    if (r != NULL && PyCell_Check(r)) /* `self` captured by a closure (3.12+: the cell exists by PY_START) */
        r = PyCell_GET(r);
    return r;
}

/* The interpreter frame running code right now on this thread (a
 * sys.monitoring callback's frame), or NULL. */
static APROF_INLINE struct _PyInterpreterFrame *
current_iframe(PyObject *code)
{
#if PY_VERSION_HEX >= 0x030D0000
    struct _PyInterpreterFrame *f = PyThreadState_GetUnchecked()->current_frame;
    return f != NULL && f->f_executable == code ? f : NULL;
#elif PY_VERSION_HEX >= 0x030C0000
    struct _PyInterpreterFrame *f = _PyThreadState_UncheckedGet()->cframe->current_frame;
    return f != NULL && (PyObject *)f->f_code == code ? f : NULL;
#else
    (void)code;
    return NULL;
#endif
}

static int
weakref_is(PyObject *wr, PyObject *obj)
{
#if PY_VERSION_HEX >= 0x030D0000
    PyObject *o = NULL;
    if (PyWeakref_GetRef(wr, &o) < 0) {
        PyErr_Clear();
        return 0;
    }
    Py_XDECREF(o);
    return o == obj;
#else
    return PyWeakref_GET_OBJECT(wr) == obj;
#endif
}

static int
inst_grow(Tracer *t)
{
    size_t n = t->inst_size ? t->inst_size * 2 : 256;
    struct InstSlot *nt = PyMem_Calloc(n, sizeof(struct InstSlot));
    if (nt == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (size_t i = 0; i < t->inst_size; i++) {
        struct InstSlot *sl = &t->inst[i];
        if (sl->key == NULL)
            continue;
        size_t j = hash_ptr(sl->key, n - 1);
        while (nt[j].key != NULL)
            j = (j + 1) & (n - 1);
        nt[j] = *sl;
    }
    PyMem_Free(t->inst);
    t->inst = nt;
    t->inst_size = n;
    return 0;
}

static void
inst_release(Tracer *t)
{
    for (size_t i = 0; i < t->inst_size; i++)
        Py_XDECREF(t->inst[i].wr);
    PyMem_Free(t->inst);
    t->inst = NULL;
    t->inst_size = t->inst_used = 0;
    Py_CLEAR(t->serials);
}

/* The object index of obj's (class, serial) description (instance_ids). */
static APROF_NOINLINE int64_t
instance_index(Tracer *t, PyObject *obj)
{
    if (t->inst_size) {
        size_t mask = t->inst_size - 1;
        for (size_t j = hash_ptr(obj, mask); t->inst[j].key != NULL; j = (j + 1) & mask)
            if (t->inst[j].key == obj && weakref_is(t->inst[j].wr, obj))
                return t->inst[j].idx;
    }
    PyObject *cls = (PyObject *)Py_TYPE(obj);
    PyObject *wr = PyWeakref_NewRef(obj, NULL);
    if (wr == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_TypeError))
            return -1;
        PyErr_Clear(); /* no weak references to it: described by its class */
        return obj_index(t, cls);
    }
    /* Everything that allocates comes before the tables change: an
     * allocation can run a finalizer, which is traced too. */
    if (t->serials == NULL && (t->serials = PyDict_New()) == NULL) {
        Py_DECREF(wr);
        return -1;
    }
    PyObject *n = PyDict_GetItemWithError(t->serials, cls);
    long serial = n != NULL ? PyLong_AsLong(n) : 0;
    PyObject *next = PyErr_Occurred() ? NULL : PyLong_FromLong(serial + 1);
    PyObject *desc = next != NULL ? Py_BuildValue("(Ol)", cls, serial) : NULL;
    if (desc == NULL || PyDict_SetItem(t->serials, cls, next) < 0 || PyList_Append(t->objs, desc) < 0
        || ((t->inst_used + 1) * 2 > t->inst_size && inst_grow(t) < 0)) {
        Py_XDECREF(next);
        Py_XDECREF(desc);
        Py_DECREF(wr);
        return -1;
    }
    Py_DECREF(next);
    Py_DECREF(desc);
    uint32_t idx = (uint32_t)(PyList_GET_SIZE(t->objs) - 1);
    size_t mask = t->inst_size - 1, j = hash_ptr(obj, mask);
    while (t->inst[j].key != NULL && t->inst[j].key != obj)
        j = (j + 1) & mask;
    if (t->inst[j].key == NULL)
        t->inst_used++;
    else
        Py_DECREF(t->inst[j].wr); /* a dead instance's address, reused */
    t->inst[j].key = obj;
    t->inst[j].wr = wr;
    t->inst[j].idx = idx;
    return idx;
}

/* Write the EV_RECV of a CALL of method code (table value v) on receiver
 * recv, unless recv is the code's default (see above). -1 on error. */
static APROF_NOINLINE int
write_receiver(Tracer *t, int tidx, uint32_t v, PyObject *recv, uint64_t now)
{
    int64_t r;
    if (v & CLS_FLAG) {
        if (!PyType_Check(recv))
            return 0;
        r = obj_index(t, recv);
    }
    else {
        r = t->instance_ids ? instance_index(t, recv) : obj_index(t, (PyObject *)Py_TYPE(recv));
    }
    if (r < 0)
        return -1;
    Py_ssize_t code = (Py_ssize_t)(v & IDX_MASK);
    if (code >= t->recv_cap) {
        Py_ssize_t cap = t->recv_cap ? t->recv_cap : 1024;
        while (cap <= code)
            cap *= 2;
        uint32_t *nr = PyMem_Realloc(t->recv_first, (size_t)cap * sizeof(uint32_t));
        if (nr == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        memset(nr + t->recv_cap, 0, (size_t)(cap - t->recv_cap) * sizeof(uint32_t));
        t->recv_first = nr;
        t->recv_cap = cap;
    }
    uint32_t mark = (uint32_t)(r & IDX_MASK) + 1, first = t->recv_first[code];
    if (first == mark)
        return 0;
    if (first == 0)
        t->recv_first[code] = mark;
    write_event(t, tidx, EV_RECV, r & IDX_MASK, now);
    return 0;
}

/* Record the EV_CALL of code in the thread slot ts (with the receiver if
 * it is a method's and the frame f is known; NULL when the source gives
 * none). Returns the code's table value (IGNORED_FLAG: not recorded), or
 * -1 when the tracer failed. */
static APROF_INLINE int64_t
record_call(Tracer *t, ThreadSlot *ts, PyObject *code, struct _PyInterpreterFrame *f)
{
    uint64_t now = now_ticks();
    int tidx = ts->tidx;
    int64_t idx = code_index(t, code);
    if (idx < 0) {
        fail(t);
        return -1;
    }
    if (idx & IGNORED_FLAG)
        return idx;
    if (APROF_UNLIKELY(idx & (METHOD_FLAG | CLS_FLAG)) && f != NULL) {
        PyObject *recv = frame_receiver(f);
        if (recv != NULL && write_receiver(t, tidx, (uint32_t)idx, recv, now) < 0) {
            fail(t);
            return -1;
        }
    }
    write_event(t, tidx, EV_CALL, idx & IDX_MASK, now);
    return idx;
}

/* A frame starts or resumes (EV_CALL). */
static APROF_INLINE int
on_call(Tracer *t, PyObject *code, struct _PyInterpreterFrame *f)
{
    ThreadSlot *ts = recording_slot(t);
    if (ts == NULL)
        return 0;
    int64_t idx = record_call(t, ts, code, f);
    return idx >= 0 && (idx & IGNORED_FLAG) ? OWN_CODE : 0;
}

static APROF_INLINE int
on_code(Tracer *t, int tag, PyObject *code)
{
    ThreadSlot *ts = recording_slot(t);
    if (ts == NULL)
        return 0;
    uint64_t now = now_ticks();
    int tidx = ts->tidx;
    int64_t idx = code_index(t, code);
    if (idx < 0) {
        fail(t);
        return 0;
    }
    if (idx & IGNORED_FLAG)
        return OWN_CODE;
    write_event(t, tidx, tag, idx & IDX_MASK, now);
    return 0;
}

/* A C call: skipped when made by aprof's own code (the caller's code is
 * ignored), so aprof's bookkeeping does not show up in the trace. */
static APROF_INLINE int
on_cfunc(Tracer *t, int tag, PyObject *caller, PyObject *callable)
{
    void *key = cfunc_key(callable);
    if (key == NULL)
        return 0;
    ThreadSlot *ts = recording_slot(t);
    if (ts == NULL)
        return 0;
    uint64_t now = now_ticks();
    int tidx = ts->tidx;
    int64_t c = code_index(t, caller);
    if (c < 0) {
        fail(t);
        return 0;
    }
    if (c & IGNORED_FLAG)
        return OWN_CODE;
    int64_t idx = cfunc_index(t, callable, key);
    if (idx < 0) {
        fail(t);
        return 0;
    }
    if (idx & IGNORED_FLAG)
        return 0; /* an aprof C method called from the program's code: not
                     recorded, but the call site is the program's (no DISABLE) */
    write_event(t, tidx, tag, idx, now);
    return 0;
}

/* A frame left by an exception of type exc_type. The type goes in an EXC
 * event just before the UNWIND, so the frame's event gets its name (the
 * UNWIND's payload is the code). */
static void
on_unwind(Tracer *t, PyObject *code, PyObject *exc_type)
{
    ThreadSlot *ts = recording_slot(t);
    if (ts == NULL)
        return;
    uint64_t now = now_ticks();
    int tidx = ts->tidx;
    int64_t idx = code_index(t, code);
    if (idx < 0) {
        fail(t);
        return;
    }
    if (idx & IGNORED_FLAG)
        return;
    int64_t e = obj_index(t, exc_type);
    if (e < 0) {
        fail(t);
        return;
    }
    write_event(t, tidx, EV_EXC, e & IDX_MASK, now);
    write_event(t, tidx, EV_UNWIND, idx & IDX_MASK, now);
}

/* ------------------------------------------------------------------------ */
/* 5. Event sources                                                          */
/* ------------------------------------------------------------------------ */

#if !APROF_MONITORING
/* 3.11: a C profile function, the PyEval_SetProfile level (what cProfile
 * uses), installed on every thread of the interpreter and, through
 * threading.setprofile, on threads started while the tracer runs. */
static int
profile_func(PyObject *obj, PyFrameObject *frame, int what, PyObject *arg)
{
    Tracer *t = (Tracer *)obj;
    PyObject *code;
    switch (what) {
    case PyTrace_CALL:
        code = (PyObject *)PyFrame_GetCode(frame);
        on_call(t, code, frame->f_frame);
        Py_DECREF(code);
        return 0;
    case PyTrace_RETURN:
        code = (PyObject *)PyFrame_GetCode(frame);
        on_code(t, arg == NULL ? EV_UNWIND : EV_RETURN, code);
        Py_DECREF(code);
        return 0;
    case PyTrace_C_CALL:
    case PyTrace_C_RETURN:
    case PyTrace_C_EXCEPTION:
        if (!t->c_calls) /* the frame evaluator's stand-in (see degrade()) */
            return 0;
        code = (PyObject *)PyFrame_GetCode(frame);
        on_cfunc(t, what == PyTrace_C_CALL ? EV_CCALL : (what == PyTrace_C_RETURN ? EV_CRETURN : EV_CRAISE), code, arg);
        Py_DECREF(code);
        return 0;
    default:
        return 0;
    }
}

/* The hook threading.setprofile gives new threads: sys.setprofile installs
 * it behind a Python trampoline, and its first call swaps in the C profile
 * function for this thread (then records that first event). */
static PyObject *
Tracer_thread_hook(Tracer *t, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "thread hook takes (frame, event, arg)");
        return NULL;
    }
    if (t->active && running_tracer == t) {
        PyEval_SetProfile(profile_func, (PyObject *)t);
        if (PyFrame_Check(args[0]) && PyUnicode_Check(args[1]) && PyUnicode_CompareWithASCIIString(args[1], "call") == 0)
            profile_func((PyObject *)t, (PyFrameObject *)args[0], PyTrace_CALL, Py_None);
    }
    else {
        PyEval_SetProfile(NULL, NULL);
    }
    Py_RETURN_NONE;
}

static PyObject *
describe_hook(PyThreadState *ts)
{
    if (ts->c_profileobj != NULL)
        return PyObject_Repr(ts->c_profileobj);
    return PyUnicode_FromFormat("a C profile function at %p", (void *)ts->c_profilefunc);
}

static int
install_311(Tracer *t)
{
    PyThreadState *me = PyThreadState_Get();
    if (me->c_profilefunc != NULL && me->c_profilefunc != profile_func) {
        PyObject *what = describe_hook(me);
        if (what != NULL) {
            PyErr_Format(PyExc_RuntimeError,
                         "aprof: python_tracer cannot start: another profiler is installed with sys.setprofile "
                         "(%U); stop it first (cProfile, yappi and others use the same hook)",
                         what);
            Py_DECREF(what);
        }
        return -1;
    }
    /* New threads: threading's hook, chained from whatever was there. */
    PyObject *threading = PyImport_ImportModule("threading");
    if (threading == NULL)
        return -1;
    PyObject *prev = PyObject_GetAttrString(threading, "_profile_hook");
    if (prev == NULL) {
        PyErr_Clear();
        prev = Py_NewRef(Py_None);
    }
    PyObject *hook = PyObject_GetAttrString((PyObject *)t, "_thread_hook");
    PyObject *r = hook ? PyObject_CallMethod(threading, "setprofile", "O", hook) : NULL;
    Py_XDECREF(hook);
    Py_DECREF(threading);
    if (r == NULL) {
        Py_DECREF(prev);
        return -1;
    }
    Py_DECREF(r);
    Py_XSETREF(t->prev_thread_hook, prev);
    /* Every thread that exists now (a thread with a foreign profiler keeps it). */
    PyInterpreterState *interp = PyThreadState_GetInterpreter(me);
    for (PyThreadState *ts = PyInterpreterState_ThreadHead(interp); ts != NULL; ts = PyThreadState_Next(ts)) {
        if (ts->c_profilefunc == NULL)
            _PyEval_SetProfile(ts, profile_func, (PyObject *)t);
    }
    t->installed_311 = 1;
    return 0;
}

static void
uninstall_311(Tracer *t)
{
    if (!t->installed_311)
        return;
    t->installed_311 = 0;
    PyThreadState *me = PyThreadState_Get();
    PyInterpreterState *interp = PyThreadState_GetInterpreter(me);
    for (PyThreadState *ts = PyInterpreterState_ThreadHead(interp); ts != NULL; ts = PyThreadState_Next(ts)) {
        if (ts->c_profilefunc == profile_func && ts->c_profileobj == (PyObject *)t)
            _PyEval_SetProfile(ts, NULL, NULL);
    }
    PyObject *threading = PyImport_ImportModule("threading");
    if (threading != NULL) {
        PyObject *prev = t->prev_thread_hook ? t->prev_thread_hook : Py_None;
        PyObject *r = PyObject_CallMethod(threading, "setprofile", "O", prev);
        Py_XDECREF(r);
        Py_DECREF(threading);
    }
    if (PyErr_Occurred())
        PyErr_WriteUnraisable((PyObject *)t);
    Py_CLEAR(t->prev_thread_hook);
}
#endif

#if APROF_EVAL
/*
 * 3.11 and 3.12 without C calls (c_calls=False): a PEP 523 frame
 * evaluator. The profile function above makes 3.11 run every instruction
 * through its tracing path, unspecialised, which alone slows call-heavy
 * code ~3.6x (measured with a profile function that does nothing); on 3.12
 * sys.monitoring's own dispatch of PY_START and PY_RETURN (finding the
 * tools, the offset, the thread state) costs ~240 instructions a call
 * before aprof's callback runs. The interpreter
 * calls a frame evaluator once per Python frame it evaluates: a call, and
 * each step of a generator or coroutine (its resume until its yield). The
 * evaluator records EV_CALL, runs the frame with the default evaluator and
 * records EV_RETURN or EV_UNWIND (after an EXC naming the exception); the
 * code runs specialised as usual. What it costs: the interpreter stops
 * inlining Python-to-Python calls (each one is a C call again: the
 * specialised calls, generator sends and property getters deopt while an
 * evaluator is set), and it cannot see C calls at all.
 *
 * 3.12 differs in three ways that matter here. Each call into
 * _PyEval_EvalFrameDefault pushes an entry frame owned by the C stack
 * (FRAME_OWNED_BY_CSTACK) into the frames' `previous` chain, which the
 * walks below skip. It charges 2 units of the C recursion counter, which
 * plain 3.12 never spends on a Python-to-Python call and which
 * sys.setrecursionlimit does not raise (1,500 of them): the evaluator gives
 * them back for the frame's duration, so a recursion fails at the depth it
 * fails without aprof (the C stack itself is guarded as on 3.11, below).
 * And closing a generator that never started does not run its frame (as
 * 3.11 does, to throw GeneratorExit into it), so it records nothing.
 *
 * Calling a generator function evaluates its frame only up to
 * RETURN_GENERATOR, which copies the frame into the new generator: that is
 * not a call of the generator's code (the profile function sees nothing
 * there either), so it is not recorded.
 *
 * Frames live at start were entered before the evaluator was installed, so
 * it never sees them leave. The tracer keeps them (outermost first, as the
 * initial stack's EV_CALLs opened them) and closes them when the starting
 * thread shows they are gone: a live generator frame has left when its
 * generator no longer executes or is resumed again; a frame has left when a
 * frame it called is entered from one of its callers. Each closes at the
 * first frame entry that shows it, which is later than it left by at most
 * the time to the next Python call on that thread.
 */
struct LiveFrame {
    struct _PyInterpreterFrame *frame;
    PyGenObject *gen; /* strong reference for a generator's frame, else NULL */
    uint32_t idx;     /* object-table index of its code */
};

/*
 * What the evaluator keeps per OS thread, in one thread-local block (one
 * address computation for all of it):
 *
 * - busy: the tracer records for itself (a new thread's logical thread is
 *   asked from Python, a receiver is described, an error is reported):
 *   frames evaluated meanwhile are not traced.
 * - stack_low and depth: the C stack's guard (below).
 * - own_gen and own_depth: the frames entered through this tracer's
 *   evaluator that this thread is running now. While there is one, the
 *   frames live at start that are left are all below it on the stack (or
 *   generators running there), so none can leave and the entry skips
 *   close_left_live().
 * - ready and tidx: the fast path (eval_frame()) is armed. ready is the
 *   running tracer's eval_gen when this thread has its slot (tidx) in it,
 *   is not busy, knows its stack's bound and counts own_depth for it; 0
 *   otherwise. One compare then stands for all of those checks; anything
 *   else takes eval_frame_slow(), which arms it again.
 */
typedef struct {
    uint64_t ready;
    uint64_t own_gen;
    uintptr_t stack_low;
    int tidx;
    int busy;
    int depth;
    int own_depth;
} EvalThread;

static APROF_TLS EvalThread tl_ev;

/*
 * The C stack. Under a frame evaluator every Python call is a C call again,
 * as before 3.11, so a recursion that plain 3.11 or 3.12 runs in a raised
 * recursion limit (sys.setrecursionlimit(100_000)) can overflow the C stack
 * (~400 bytes a level). Before that, the tracer hands over for the rest of
 * the profile (degrade()): to the profile function on 3.11, to the
 * sys.monitoring callbacks (the tool id the driver holds) on 3.12. Calls are
 * inlined again and the recording goes on, slower. stack_low is the lowest address this
 * thread's frames may reach: its stack's end plus a margin for whatever
 * runs deeper (Linux: the thread's stack as pthread reports it, asked once
 * per thread; elsewhere, or if pthread cannot tell (stack_low 1), a depth
 * of 2,000 evaluator levels, twice the default recursion limit, counted in
 * depth by the slow path only: such a thread never arms the fast path).
 */
#define STACK_MARGIN (256 * 1024)
#define FALLBACK_DEPTH 2000

#if defined(__linux__)
#include <pthread.h>
static uintptr_t
stack_low(void)
{
    pthread_attr_t attr;
    void *addr;
    size_t size;
    uintptr_t low = 1;
    if (pthread_getattr_np(pthread_self(), &attr) == 0) {
        /* A small stack (threading.stack_size) keeps half of itself. */
        if (pthread_attr_getstack(&attr, &addr, &size) == 0 && size > 0)
            low = (uintptr_t)addr + (size > 2 * STACK_MARGIN ? STACK_MARGIN : size / 2);
        pthread_attr_destroy(&attr);
    }
    return low;
}
#endif

/* Where this thread's C stack is now. The stack pointer itself where it
 * can be read: __builtin_frame_address(0) makes the function keep a frame
 * pointer, which costs the evaluator's fast path a register. */
static APROF_INLINE uintptr_t
stack_here(void)
{
#if defined(__GNUC__) && defined(__x86_64__)
    uintptr_t sp;
    __asm__("movq %%rsp, %0" : "=r"(sp));
    return sp;
#elif defined(__GNUC__) && defined(__aarch64__)
    uintptr_t sp;
    __asm__("mov %0, sp" : "=r"(sp));
    return sp;
#else
    return (uintptr_t)__builtin_frame_address(0);
#endif
}

static APROF_INLINE int
stack_is_low(void)
{
    EvalThread *ev = &tl_ev;
#if defined(__linux__)
    if (APROF_UNLIKELY(ev->stack_low == 0))
        ev->stack_low = stack_low();
    if (ev->stack_low > 1)
        return stack_here() < ev->stack_low;
#endif
    return ev->depth > FALLBACK_DEPTH;
}

/* Recording for itself (see EvalThread): frames are not traced, and the
 * fast path is disarmed. */
static APROF_INLINE void
eval_busy(EvalThread *ev)
{
    ev->busy = 1;
    ev->ready = 0;
}

/* The end of eval_busy(): the fast path is armed again when it applies. */
static APROF_INLINE void
eval_unbusy(EvalThread *ev, Tracer *t)
{
    ev->busy = 0;
    if (tl_gen == t->gen && ev->own_gen == t->eval_gen && ev->stack_low > 1) {
        ev->tidx = tl_tidx;
        ev->ready = t->eval_gen;
    }
}

static void
release_live(Tracer *t)
{
    for (Py_ssize_t i = 0; i < t->nlive; i++)
        Py_XDECREF(t->live[i].gen);
    PyMem_Free(t->live);
    t->live = NULL;
    t->nlive = 0;
    t->live_tstate = NULL;
}

static PyGenObject *
frame_generator(struct _PyInterpreterFrame *f)
{
    if (f->owner != FRAME_OWNED_BY_GENERATOR)
        return NULL;
    return (PyGenObject *)((char *)f - offsetof(PyGenObject, gi_iframe));
}

/* The frame calling (or resuming) the frame being entered: the thread's
 * current frame, past 3.12's entry frames. (The entered frame's own
 * `previous` is set only once _PyEval_EvalFrameDefault runs it.) */
static struct _PyInterpreterFrame *
calling_frame(PyThreadState *tstate)
{
    struct _PyInterpreterFrame *c = tstate->cframe->current_frame;
#if PY_VERSION_HEX >= 0x030C0000
    while (c != NULL && c->owner == FRAME_OWNED_BY_CSTACK)
        c = c->previous;
#endif
    return c;
}

/* Find the live frames of the initial stack (codes, outermost first) on
 * this thread's frame chain, innermost first. A code not found keeps no
 * frame: its EV_CALL closes at stop. */
static int
find_live(Tracer *t, PyObject *seq, int32_t lt)
{
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    release_live(t);
    if (n == 0)
        return 0;
    t->live = PyMem_Calloc((size_t)n, sizeof(struct LiveFrame));
    if (t->live == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    PyThreadState *tstate = PyThreadState_Get();
    struct _PyInterpreterFrame *f = calling_frame(tstate); /* (3.12's entry frames never match a code) */
    Py_ssize_t found = 0;
    struct LiveFrame *tmp = PyMem_Calloc((size_t)n, sizeof(struct LiveFrame));
    if (tmp == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = n - 1; i >= 0 && f != NULL; i--) {
        PyObject *code = PySequence_Fast_GET_ITEM(seq, i);
        while (f != NULL && (PyObject *)f->f_code != code)
            f = f->previous;
        if (f == NULL)
            break;
        int64_t idx = code_index(t, code);
        if (idx < 0) {
            for (Py_ssize_t k = 0; k < found; k++)
                Py_XDECREF(tmp[k].gen);
            PyMem_Free(tmp);
            return -1;
        }
        if (!(idx & IGNORED_FLAG)) {
            tmp[found].frame = f;
            tmp[found].gen = (PyGenObject *)Py_XNewRef((PyObject *)frame_generator(f));
            tmp[found].idx = (uint32_t)idx & IDX_MASK;
            found++;
        }
        f = f->previous;
    }
    for (Py_ssize_t i = 0; i < found; i++) /* outermost first */
        t->live[i] = tmp[found - 1 - i];
    PyMem_Free(tmp);
    t->nlive = found;
    t->live_tstate = tstate;
    t->live_lt = lt;
    return 0;
}

static void close_live_from(Tracer *t, Py_ssize_t keep);

/* Close the live frames that frame f's entry shows are gone (see above):
 * each writes its EV_RETURN on the starting logical thread. */
static APROF_NOINLINE void
close_left_live(Tracer *t, PyThreadState *tstate, struct _PyInterpreterFrame *f)
{
    struct _PyInterpreterFrame *caller = calling_frame(tstate);
    Py_ssize_t keep = t->nlive;
    for (Py_ssize_t j = 0; j < t->nlive; j++) {
        struct LiveFrame *lf = &t->live[j];
        if (lf->frame == f || (lf->gen != NULL && lf->gen->gi_frame_state != FRAME_EXECUTING)) {
            keep = j; /* it left (and so did everything it called) */
            break;
        }
        if (lf->frame == caller) {
            keep = j + 1; /* it is f's caller: what it called has left */
            break;
        }
    }
    close_live_from(t, keep);
}

/* Write the returns of live frames keep.. (innermost first) and drop them. */
static void
close_live_from(Tracer *t, Py_ssize_t keep)
{
    if (keep >= t->nlive)
        return;
    ThreadSlot *ts = tl_gen == t->gen ? &t->threads[tl_tidx] : thread_slot(t);
    uint64_t now = now_ticks();
    for (Py_ssize_t j = t->nlive - 1; j >= keep; j--) {
        if (ts != NULL) {
            if (ts->cur_lt != t->live_lt) {
                ts->cur_lt = t->live_lt;
                push(t, EV_SWITCH, ts->tidx, (uint64_t)t->live_lt, now);
            }
            push(t, EV_RETURN, ts->tidx, t->live[j].idx, now);
        }
        Py_CLEAR(t->live[j].gen);
    }
    t->nlive = keep;
}

static void uninstall_eval(Tracer *t);
#if APROF_MONITORING
static int monitor_frames(Tracer *t);
#else
static int install_311(Tracer *t);
#endif

/* The C stack runs low (see above): hand over to the profile function
 * (3.11) or to the sys.monitoring callbacks of Python frames (3.12), which
 * record the rest of the profile without C calls. The frames now running
 * under the evaluator opened with their EV_CALL; the new hook records their
 * returns (both instrument the code already running). If another profiler
 * holds the 3.11 hook, or the tool id was released, the tracer stops
 * recording. */
static APROF_NOINLINE void
degrade(Tracer *t)
{
    uninstall_eval(t);
    t->degraded = 1;
#if APROF_MONITORING
    if (monitor_frames(t) < 0)
#else
    if (install_311(t) < 0)
#endif
        fail(t);
}

#if PY_VERSION_HEX >= 0x030C0000
/* What 3.12's _PyEval_EvalFrameDefault charges the C recursion counter on
 * entry (its PY_EVAL_C_STACK_UNITS), given back around the call (see above). */
#define EVAL_C_UNITS 2
#endif

/* Frame f, live at start, returns through the evaluator after all: it was
 * entered under an earlier tracer's evaluator (a schedule's next cycle
 * started in it). Its own return is written as usual; it leaves the live
 * list, with the live frames it called, which have left unseen. */
static APROF_NOINLINE void
forget_live(Tracer *t, struct _PyInterpreterFrame *f)
{
    for (Py_ssize_t j = t->nlive - 1; j >= 0; j--) {
        if (t->live[j].frame != f)
            continue;
        close_live_from(t, j + 1);
        Py_CLEAR(t->live[j].gen);
        t->nlive = j;
        return;
    }
}

/* The raised exception, taken out of the thread state and put back as it
 * was (3.12 keeps one object, 3.11 a (type, value, traceback) triple);
 * type is NULL when none is set. */
typedef struct {
    PyObject *type, *value, *tb;
} Raised;

static APROF_INLINE Raised
raised_take(void)
{
    Raised r = {NULL, NULL, NULL};
#if PY_VERSION_HEX >= 0x030C0000
    r.value = PyErr_GetRaisedException();
    r.type = r.value != NULL ? (PyObject *)Py_TYPE(r.value) : NULL;
#else
    PyErr_Fetch(&r.type, &r.value, &r.tb);
#endif
    return r;
}

static APROF_INLINE void
raised_restore(Raised r)
{
#if PY_VERSION_HEX >= 0x030C0000
    PyErr_SetRaisedException(r.value);
#else
    PyErr_Restore(r.type, r.value, r.tb);
#endif
}

/* The default evaluator, run as if the frame were entered without one: on
 * 3.12 the C recursion units its entry charges are given back (see above). */
static APROF_INLINE PyObject *
eval_default(PyThreadState *tstate, struct _PyInterpreterFrame *f, int throwflag)
{
#if PY_VERSION_HEX >= 0x030C0000
    tstate->c_recursion_remaining += EVAL_C_UNITS;
    PyObject *r = _PyEval_EvalFrameDefault(tstate, f, throwflag);
    tstate->c_recursion_remaining -= EVAL_C_UNITS;
    return r;
#else
    return _PyEval_EvalFrameDefault(tstate, f, throwflag);
#endif
}

/* Will the default evaluator refuse this frame with a RecursionError before
 * running any of it? Then it is no call: the profile function and
 * sys.monitoring see none either (the check comes before PY_START). */
static APROF_INLINE int
recursion_fails(PyThreadState *tstate)
{
    /* (tstate->recursion_headroom: handling a RecursionError, frames run past the limit) */
#if PY_VERSION_HEX >= 0x030C0000
    return APROF_UNLIKELY(tstate->py_recursion_remaining <= 0 || tstate->c_recursion_remaining < 0)
           && !tstate->recursion_headroom;
#else
    return APROF_UNLIKELY(tstate->recursion_remaining <= 0) && !tstate->recursion_headroom;
#endif
}

/* The evaluator's EV_CALL: the code's table value when recorded, else -1
 * (the context is not recorded, or the tracer failed). */
static APROF_INLINE int64_t
eval_call(Tracer *t, PyThreadState *tstate, PyCodeObject *co, struct _PyInterpreterFrame *f)
{
    ThreadSlot *ts = recording_slot_of(t, tstate);
    return ts != NULL ? record_call(t, ts, (PyObject *)co, f) : -1;
}

/* The evaluator's EV_RETURN or EV_UNWIND of code co (table value idx from
 * its EV_CALL, or -1 to look it up). */
static APROF_INLINE void
eval_return(Tracer *t, PyThreadState *tstate, PyCodeObject *co, int64_t idx, PyObject *r)
{
    if (APROF_UNLIKELY(r == NULL)) {
        Raised exc = raised_take();
        if (exc.type != NULL)
            on_unwind(t, (PyObject *)co, exc.type);
        else
            on_code(t, EV_UNWIND, (PyObject *)co);
        raised_restore(exc);
        return;
    }
    ThreadSlot *ts = recording_slot_of(t, tstate);
    if (ts == NULL)
        return;
    uint64_t now = now_ticks();
    int tidx = ts->tidx;
    if (idx < 0 && (idx = code_index(t, (PyObject *)co)) < 0) {
        fail(t);
        return;
    }
    if (!(idx & IGNORED_FLAG))
        write_event(t, tidx, EV_RETURN, idx & IDX_MASK, now);
}

/* The return half of an evaluated frame, out of line: the tracer stopped
 * or changed in the frame, the frame raised, or the context is not the
 * cached one (gen: the tracer's at entry; idx: the EV_CALL's table value,
 * or below 0 to look the code up, as eval_return() takes it). */
static APROF_NOINLINE PyObject *
eval_leave_slow(PyThreadState *tstate, struct _PyInterpreterFrame *f, PyCodeObject *co, uint64_t gen, int64_t idx,
                PyObject *r)
{
    EvalThread *ev = &tl_ev;
    Tracer *t = running_tracer; /* the profile may have stopped in the frame (t may be gone) */
    if (t != NULL && !ev->busy && t->eval_installed) {
        eval_busy(ev);
        if (APROF_UNLIKELY(t->gen != gen)) {
            /* entered under an earlier tracer's evaluator (a schedule's
             * next cycle started in it): on this tracer's live list */
            idx = -1;
            if (t->nlive != 0 && tstate == t->live_tstate)
                forget_live(t, f);
        }
        eval_return(t, tstate, co, idx, r);
        eval_unbusy(ev, t);
    }
    Py_DECREF(co);
    return r;
}

/* The evaluator's general path: every frame the fast path (eval_frame())
 * does not take. It arms the fast path for the next frame when it applies. */
static APROF_NOINLINE PyObject *
eval_frame_slow(PyThreadState *tstate, struct _PyInterpreterFrame *f, int throwflag)
{
    EvalThread *ev = &tl_ev;
    Tracer *t = running_tracer;
    PyCodeObject *co = f->f_code;
    if (t == NULL || ev->busy || !t->active || !t->eval_installed
        || ((co->co_flags & (CO_GENERATOR | CO_COROUTINE | CO_ASYNC_GENERATOR)) && f->owner != FRAME_OWNED_BY_GENERATOR))
        return eval_default(tstate, f, throwflag);
    if (APROF_UNLIKELY(stack_is_low())) {
        eval_busy(ev);
        degrade(t);
        eval_unbusy(ev, t);
        return eval_default(tstate, f, throwflag);
    }
    if (APROF_UNLIKELY(recursion_fails(tstate)))
        return eval_default(tstate, f, throwflag); /* a RecursionError, no call (as the hooks see it) */
    uint64_t gen = t->gen;
    if (APROF_UNLIKELY(ev->own_gen != gen)) {
        ev->own_gen = gen;
        ev->own_depth = 0;
    }
    int64_t idx;
    eval_busy(ev);
    if (APROF_UNLIKELY(throwflag)) {
        /* throw() and close() enter with the exception to raise in the
         * frame already set: recording (which may call into Python on a
         * context's first sight) runs without it. */
        Raised thrown = raised_take();
        if (APROF_UNLIKELY(t->nlive != 0) && ev->own_depth == 0 && tstate == t->live_tstate)
            close_left_live(t, tstate, f);
        idx = eval_call(t, tstate, co, f);
        raised_restore(thrown);
    }
    else {
        if (APROF_UNLIKELY(t->nlive != 0) && ev->own_depth == 0 && tstate == t->live_tstate)
            close_left_live(t, tstate, f);
        idx = eval_call(t, tstate, co, f);
    }
    eval_unbusy(ev, t);
    Py_INCREF(co); /* the frame's own reference goes when it is popped */
    ev->depth++;
    ev->own_depth++;
    PyObject *r = eval_default(tstate, f, throwflag);
    ev->depth--;
    if (APROF_LIKELY(ev->own_gen == gen))
        ev->own_depth--; /* (else another tracer started in the frame and counts its own) */
    return eval_leave_slow(tstate, f, co, gen, idx, r);
}

/* The fast path's EV_CALL of a method (table value idx): its receiver may
 * be described for the first time, which allocates (a finalizer may run),
 * so it is written while busy. Returns idx, or -1 when the tracer failed. */
static APROF_NOINLINE int64_t
eval_call_method(Tracer *t, int tidx, int64_t idx, struct _PyInterpreterFrame *f, uint64_t now)
{
    EvalThread *ev = &tl_ev;
    PyObject *recv = frame_receiver(f);
    eval_busy(ev);
    if (recv != NULL && write_receiver(t, tidx, (uint32_t)idx, recv, now) < 0) {
        fail(t);
        idx = -1;
    }
    else {
        write_event(t, tidx, EV_CALL, idx & IDX_MASK, now);
    }
    eval_unbusy(ev, t);
    return idx;
}

/*
 * The frame evaluator. Its fast path is the common frame: the thread is
 * armed (see EvalThread: it has its slot, is not busy, knows its stack's
 * bound), the frame is no throw() and no generator's creation, the C stack
 * and the recursion limit have room, the context is the thread's cached
 * one (recorded or not), and the code was seen before. It then costs a few
 * loads and compares besides the two events. At the return the context is
 * compared with the cached one again (a ContextVar.set in the frame, or a
 * context switch that leaves a frame of another context, changes it), and
 * the tracer with its eval_gen (stopped, failed, degraded or replaced in
 * the frame: the slow return half decides). Anything else takes
 * eval_frame_slow(), which behaves the same, with every check.
 */
static PyObject *
eval_frame(PyThreadState *tstate, struct _PyInterpreterFrame *f, int throwflag)
{
    EvalThread *ev = &tl_ev;
    uint64_t gen = running_eval_gen;
    Tracer *t = running_tracer; /* not NULL when the thread is armed for gen (never EVAL_OFF) */
    PyCodeObject *co = f->f_code;
    if (APROF_UNLIKELY(ev->ready != gen || throwflag || (t->nlive != 0 && ev->own_depth == 0)
                       || ((co->co_flags & (CO_GENERATOR | CO_COROUTINE | CO_ASYNC_GENERATOR))
                           && f->owner != FRAME_OWNED_BY_GENERATOR)
                       || stack_here() < ev->stack_low || recursion_fails(tstate)))
        return eval_frame_slow(tstate, f, throwflag);
    int tidx = ev->tidx;
    ThreadSlot *ts = &t->threads[tidx];
    PyObject *vars = context_vars_of(tstate);
    if (APROF_UNLIKELY(vars == NULL || vars != ts->last_vars))
        return eval_frame_slow(tstate, f, throwflag);
    /* idx: the EV_CALL's code index (flags dropped), -1 when none was
     * written, -2 for aprof's own code (eval_return() looks both up). */
    int64_t idx = -1;
    if (ts->last_in) {
        uint64_t now = now_ticks();
        idx = table_get(t, co);
        if (APROF_UNLIKELY(idx < 0))
            return eval_frame_slow(tstate, f, throwflag); /* first sight: added there */
        if (APROF_UNLIKELY(idx & (METHOD_FLAG | CLS_FLAG | IGNORED_FLAG))) {
            if (idx & IGNORED_FLAG)
                idx = -2;
            else if ((idx = eval_call_method(t, tidx, idx, f, now)) >= 0)
                idx &= IDX_MASK;
        }
        else {
            write_event(t, tidx, EV_CALL, idx, now);
        }
    }
    Py_INCREF(co); /* the frame's own reference goes when it is popped */
    ev->own_depth++;
    PyObject *r = eval_default(tstate, f, throwflag);
    if (APROF_LIKELY(ev->own_gen == gen))
        ev->own_depth--; /* (else another tracer started in the frame and counts its own) */
    /* The same tracer, still recording through the evaluator, a return
     * (not an exception), not aprof's own code, and the cached context:
     * the EV_RETURN when it is recorded (and the EV_CALL was written),
     * nothing when it is not. */
    if (APROF_LIKELY(running_eval_gen == gen && r != NULL && idx >= -1)) {
        ts = &t->threads[tidx];
        vars = context_vars_of(tstate);
        if (APROF_LIKELY(vars != NULL && vars == ts->last_vars)) {
            if (!ts->last_in) {
                Py_DECREF(co);
                return r;
            }
            if (APROF_LIKELY(idx >= 0)) {
                write_event(t, tidx, EV_RETURN, idx, now_ticks());
                Py_DECREF(co);
                return r;
            }
        }
    }
    return eval_leave_slow(tstate, f, co, gen, idx, r);
}

/* Another tool's frame evaluator, if one is installed, else NULL. */
static _PyFrameEvalFunction
foreign_evaluator(PyInterpreterState *interp)
{
    _PyFrameEvalFunction cur = _PyInterpreterState_GetEvalFrameFunc(interp);
    return cur != _PyEval_EvalFrameDefault && cur != eval_frame ? cur : NULL;
}

static int
install_eval(Tracer *t)
{
    PyInterpreterState *interp = PyInterpreterState_Get();
    _PyFrameEvalFunction cur = foreign_evaluator(interp);
    if (cur != NULL) {
        PyErr_Format(PyExc_RuntimeError,
                     "aprof: python_tracer cannot start: another tool has replaced the interpreter's frame "
                     "evaluator (PEP 523; a debugger or torch.compile do) with the function at %p; stop it "
                     "first, or trace with C calls (c_calls=True), which does not use it",
                     (void *)cur);
        return -1;
    }
    _PyInterpreterState_SetEvalFrameFunc(interp, eval_frame);
    t->eval_installed = 1;
    t->eval_gen = t->gen;
    eval_sync();
    return 0;
}

static void
uninstall_eval(Tracer *t)
{
    if (!t->eval_installed)
        return;
    t->eval_installed = 0;
    t->eval_gen = EVAL_OFF;
    eval_sync();
    PyInterpreterState *interp = PyInterpreterState_Get();
    if (_PyInterpreterState_GetEvalFrameFunc(interp) == eval_frame)
        _PyInterpreterState_SetEvalFrameFunc(interp, _PyEval_EvalFrameDefault);
    release_live(t);
}
#endif

#if APROF_MONITORING
/*
 * 3.12+: sys.monitoring callbacks. Each is a Hook: a tiny callable object
 * whose vectorcall slot is the handler itself, so sys.monitoring calls
 * straight into it (a builtin method would add its own call layer, a
 * recursion check and a result check per event). The monitoring API passes
 * the code object first (no frame object is made). Tracer.py_start and the
 * other event names give a new Hook for the tracer; aprof/_core/_tracer.py
 * registers them.
 */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    Tracer *t;
    const char *name;
} Hook;

/* The arguments sys.monitoring passes: at least `need` positional ones, the
 * first a code object. Anything else is a caller's mistake (sys.monitoring
 * itself never does it), reported as a TypeError. */
static APROF_INLINE int
hook_args(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames, Py_ssize_t need)
{
    if (APROF_LIKELY(PyVectorcall_NARGS(nargsf) >= need && kwnames == NULL && PyCode_Check(args[0])))
        return 1;
    PyErr_Format(PyExc_TypeError,
                 "aprof tracer hook %s: expected (code, offset%s) as sys.monitoring passes them",
                 ((Hook *)self)->name, need == 2 ? "" : (need == 3 ? ", arg" : ", callable, arg0"));
    return 0;
}

#define HOOK_TRACER(self) (((Hook *)(self))->t)

static PyObject *disable_sentinel; /* sys.monitoring.DISABLE */

/* A local event's answer: switch the location off for aprof's own code. */
static APROF_INLINE PyObject *
switch_off_if_own(int r)
{
    return Py_NewRef(r == OWN_CODE ? disable_sentinel : Py_None);
}

/* PY_START, PY_RESUME, PY_RETURN and PY_YIELD are local events: for aprof's
 * own code the location is switched off (DISABLE), so its frames cost
 * nothing after their first event. restart_events() at the next start
 * switches them back on (see aprof/_core/_tracer.py). */
static PyObject *
hook_py_start(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    if (!hook_args(self, args, nargsf, kwnames, 2))
        return NULL;
    return switch_off_if_own(on_call(HOOK_TRACER(self), args[0], current_iframe(args[0])));
}

/* PY_THROW cannot be switched off (sys.monitoring raises if asked). */
static PyObject *
hook_py_throw(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    if (!hook_args(self, args, nargsf, kwnames, 2))
        return NULL;
    on_call(HOOK_TRACER(self), args[0], current_iframe(args[0]));
    Py_RETURN_NONE;
}

static PyObject *
hook_py_return(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    if (!hook_args(self, args, nargsf, kwnames, 2))
        return NULL;
    return switch_off_if_own(on_code(HOOK_TRACER(self), EV_RETURN, args[0]));
}

static PyObject *
hook_py_unwind(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    if (!hook_args(self, args, nargsf, kwnames, 3))
        return NULL;
    on_unwind(HOOK_TRACER(self), args[0], (PyObject *)Py_TYPE(args[2]));
    Py_RETURN_NONE;
}

/* CALL fires for every call; only C callables are recorded here (Python
 * ones get PY_START). A call site that calls a Python function is switched
 * off for CALL (and so for its C_RETURN), which halves the callbacks of
 * Python-heavy code; a site that calls both loses its C calls. So is a call
 * site in aprof's own code. C_RETURN and C_RAISE cannot be switched off
 * themselves: sys.monitoring raises if asked. */
static PyObject *
hook_call(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    if (!hook_args(self, args, nargsf, kwnames, 4))
        return NULL;
    PyObject *callable = args[2];
    if (PyFunction_Check(callable) || PyMethod_Check(callable))
        return Py_NewRef(disable_sentinel);
    return switch_off_if_own(on_cfunc(HOOK_TRACER(self), EV_CCALL, args[0], callable));
}

static PyObject *
hook_c_return(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    if (!hook_args(self, args, nargsf, kwnames, 4))
        return NULL;
    on_cfunc(HOOK_TRACER(self), EV_CRETURN, args[0], args[2]);
    Py_RETURN_NONE;
}

static PyObject *
hook_c_raise(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    if (!hook_args(self, args, nargsf, kwnames, 4))
        return NULL;
    on_cfunc(HOOK_TRACER(self), EV_CRAISE, args[0], args[2]);
    Py_RETURN_NONE;
}

static void
Hook_dealloc(Hook *h)
{
    Py_XDECREF(h->t);
    PyObject_Free(h);
}

static PyObject *
Hook_repr(Hook *h)
{
    return PyUnicode_FromFormat("<aprof tracer hook %s>", h->name);
}

static PyTypeObject HookType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "aprof._ctracer.Hook",
    .tp_basicsize = sizeof(Hook),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "One sys.monitoring callback of a Tracer (see Tracer.py_start).",
    .tp_vectorcall_offset = offsetof(Hook, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_dealloc = (destructor)Hook_dealloc,
    .tp_repr = (reprfunc)Hook_repr,
};

typedef struct {
    const char *name;
    vectorcallfunc fn;
} HookDef;

static HookDef hook_defs[] = {
    {"py_start", hook_py_start},   {"py_resume", hook_py_start}, {"py_throw", hook_py_throw},
    {"py_return", hook_py_return}, {"py_yield", hook_py_return}, {"py_unwind", hook_py_unwind},
    {"call", hook_call},           {"c_return", hook_c_return},  {"c_raise", hook_c_raise},
};

/* Tracer.<event>: a new Hook holding the tracer (a strong reference: a hook
 * kept after its tracer is dropped still points at a live, stopped tracer). */
static PyObject *
Tracer_get_hook(Tracer *t, void *closure)
{
    HookDef *def = (HookDef *)closure;
    Hook *h = PyObject_New(Hook, &HookType);
    if (h == NULL)
        return NULL;
    h->vectorcall = def->fn;
    h->t = (Tracer *)Py_NewRef(t);
    h->name = def->name;
    return (PyObject *)h;
}

static PyObject *monitoring; /* sys.monitoring */

#if APROF_EVAL
/* degrade() on 3.12: the callbacks of Python frames (hook_defs[0..5]) go
 * on for the tool id the driver claimed at start (PROFILER_ID), as they
 * would be with the evaluator switched off (see aprof/_core/_tracer.py). */
static int
monitor_frames(Tracer *t)
{
    static const char *const events[] = {"PY_START", "PY_RESUME", "PY_THROW", "PY_RETURN", "PY_YIELD", "PY_UNWIND"};
    PyObject *tool = PyObject_GetAttrString(monitoring, "PROFILER_ID");
    PyObject *evs = tool != NULL ? PyObject_GetAttrString(monitoring, "events") : NULL;
    PyObject *owner = evs != NULL ? PyObject_CallMethod(monitoring, "get_tool", "O", tool) : NULL;
    int ok = owner != NULL;
    if (owner == Py_None) {
        PyErr_SetString(PyExc_RuntimeError, "aprof tracer: the profiler's sys.monitoring tool id was released");
        ok = 0;
    }
    long mask = 0;
    for (int i = 0; ok && i < 6; i++) {
        PyObject *ev = PyObject_GetAttrString(evs, events[i]);
        PyObject *hook = ev != NULL ? Tracer_get_hook(t, &hook_defs[i]) : NULL;
        PyObject *r = hook != NULL ? PyObject_CallMethod(monitoring, "register_callback", "OOO", tool, ev, hook) : NULL;
        ok = r != NULL;
        if (ok)
            mask |= PyLong_AsLong(ev);
        Py_XDECREF(r);
        Py_XDECREF(hook);
        Py_XDECREF(ev);
    }
    PyObject *r = ok ? PyObject_CallMethod(monitoring, "set_events", "Ol", tool, mask) : NULL;
    Py_XDECREF(r);
    Py_XDECREF(owner);
    Py_XDECREF(evs);
    Py_XDECREF(tool);
    return r != NULL ? 0 : -1;
}
#endif
#endif

/* ------------------------------------------------------------------------ */
/* 6. The Tracer type                                                        */
/* ------------------------------------------------------------------------ */

static int
Tracer_init(Tracer *t, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"rf_state",   "recorder", "lt_var",       "thread_lt", "ignore_prefix",
                             "max_events", "c_calls",  "instance_ids", "evaluator", "keep_latest", NULL};
    PyObject *rf_var, *recorder, *lt_var, *thread_lt, *prefix;
    Py_ssize_t max_events = 0;
    int c_calls = 1, instance_ids = 0, evaluator = 1, keep_latest = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOOU|npppp", kwlist, &rf_var, &recorder, &lt_var, &thread_lt,
                                     &prefix, &max_events, &c_calls, &instance_ids, &evaluator, &keep_latest))
        return -1;
    if (!PyContextVar_CheckExact(rf_var) || !PyContextVar_CheckExact(lt_var)) {
        PyErr_SetString(PyExc_TypeError, "Tracer: rf_state and lt_var must be ContextVars");
        return -1;
    }
    if (max_events < 0) {
        PyErr_SetString(PyExc_ValueError, "Tracer: max_events must be >= 0");
        return -1;
    }
    if (keep_latest && max_events == 0) {
        PyErr_SetString(PyExc_ValueError, "Tracer: keep_latest needs max_events > 0");
        return -1;
    }
    if (t->active || t->start_ns) {
        PyErr_SetString(PyExc_RuntimeError, "Tracer: cannot be initialised again once started");
        return -1;
    }
    Py_XSETREF(t->rf_var, Py_NewRef(rf_var));
    Py_XSETREF(t->recorder, Py_NewRef(recorder));
    Py_XSETREF(t->lt_var, Py_NewRef(lt_var));
    Py_XSETREF(t->thread_lt, Py_NewRef(thread_lt));
    Py_XSETREF(t->ignore_prefix, Py_NewRef(prefix));
    t->global = recorder == Py_None;
    t->max_events = max_events;
    t->ring = keep_latest;
    /* A segment an eighth of the budget, less the one event a push may
     * write past its limit (a TIME before its event), so the eight hold at
     * most max_events; at least 4 (a header is at most three events). */
    t->seg_cap = keep_latest ? Py_MAX(max_events / RING_SEGS - 1, 4) : 0;
    /* A budget near PY_SSIZE_T_MAX would wrap a segment's byte count: no
     * more than a segment's bytes can count (its allocation then fails and
     * the events are dropped, counted, as without memory). */
    if (t->seg_cap > PY_SSIZE_T_MAX / (Py_ssize_t)sizeof(RawEvent) - RING_SLACK)
        t->seg_cap = PY_SSIZE_T_MAX / (Py_ssize_t)sizeof(RawEvent) - RING_SLACK;
    t->c_calls = c_calls;
    t->use_eval = APROF_EVAL && !c_calls && evaluator;
    t->instance_ids = instance_ids;
    if (t->objs == NULL && (t->objs = PyList_New(0)) == NULL)
        return -1;
    t->gen = next_gen++;
#if APROF_EVAL
    t->eval_gen = EVAL_OFF;
#endif
    return 0;
}

static void
release_threads(Tracer *t)
{
    for (int i = 0; i < t->nthreads; i++)
        Py_CLEAR(t->threads[i].last_vars);
    PyMem_Free(t->threads);
    t->threads = NULL;
    t->nthreads = 0;
}

static int
Tracer_traverse(Tracer *t, visitproc visit, void *arg)
{
    Py_VISIT(t->rf_var);
    Py_VISIT(t->recorder);
    Py_VISIT(t->lt_var);
    Py_VISIT(t->thread_lt);
    Py_VISIT(t->objs);
    Py_VISIT(t->pos);
    Py_VISIT(t->neg);
    Py_VISIT(t->prev_thread_hook);
    Py_VISIT(t->serials);
    for (size_t i = 0; i < t->inst_size; i++)
        Py_VISIT(t->inst[i].wr);
    for (int i = 0; i < t->nthreads; i++)
        Py_VISIT(t->threads[i].last_vars);
#if APROF_EVAL
    for (Py_ssize_t i = 0; i < t->nlive; i++)
        Py_VISIT(t->live[i].gen);
#endif
    return 0;
}

static int
Tracer_clear(Tracer *t)
{
    Py_CLEAR(t->rf_var);
    Py_CLEAR(t->recorder);
    Py_CLEAR(t->lt_var);
    Py_CLEAR(t->thread_lt);
    Py_CLEAR(t->ignore_prefix);
    Py_CLEAR(t->objs);
    Py_CLEAR(t->pos);
    Py_CLEAR(t->neg);
    Py_CLEAR(t->prev_thread_hook);
    inst_release(t);
    for (int i = 0; i < t->nthreads; i++)
        Py_CLEAR(t->threads[i].last_vars);
#if APROF_EVAL
    for (Py_ssize_t i = 0; i < t->nlive; i++)
        Py_CLEAR(t->live[i].gen);
#endif
    return 0;
}

static void
Tracer_dealloc(Tracer *t)
{
    PyObject_GC_UnTrack(t);
    if (running_tracer == t)
        running_tracer = NULL;
#if APROF_EVAL
    uninstall_eval(t);
    eval_sync();
#endif
    Tracer_clear(t);
    release_threads(t);
    buf_free(t->buf, t->cap);
    for (int i = 0; i < t->nsegs; i++)
        buf_free(t->segs[i], t->seg_cap + RING_SLACK);
    PyMem_Free(t->table);
    PyMem_Free(t->recv_first);
    Py_TYPE(t)->tp_free((PyObject *)t);
}

static PyObject *
Tracer_start(Tracer *t, PyObject *initial)
{
    if (t->objs == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Tracer: not initialised");
        return NULL;
    }
    if (t->active || t->start_ns) {
        PyErr_SetString(PyExc_RuntimeError, "Tracer.start: this tracer was already started");
        return NULL;
    }
    if (running_tracer != NULL) {
        PyErr_SetString(PyExc_RuntimeError,
                        "aprof: another profile with python_tracer=True is running in this process; "
                        "only one Python tracer can run at a time");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(initial, "Tracer.start: initial must be a sequence of code objects");
    if (seq == NULL)
        return NULL;
    read_pair(&t->calib[0], &t->calib[1]);
    t->start_ns = t->last_ns = t->calib[0];
    t->active = 1;
    /* Frames already on the stack (outermost first) open at the start time
     * (RELIABILITY LC-06), on the starting logical thread; their returns
     * close them as usual. */
    ThreadSlot *ts = thread_slot(t);
    int32_t lt = -1;
    if (ts != NULL) {
        int tidx = ts->tidx;
        lt = context_lt(t, ts);
        t->threads[tidx].last_lt = lt;
    }
    if (lt == -2) /* the starting thread is always registered; just in case */
        lt = -1;
    for (Py_ssize_t i = 0; lt >= 0 && i < PySequence_Fast_GET_SIZE(seq); i++) {
        PyObject *code = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyCode_Check(code))
            continue;
        int64_t idx = code_index(t, code);
        if (idx < 0) {
            lt = -1;
            break;
        }
        if (!(idx & IGNORED_FLAG))
            write_event(t, tl_tidx, EV_CALL, idx & IDX_MASK, t->start_ns);
    }
    if (lt < 0) {
        t->active = 0;
        Py_DECREF(seq);
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_RuntimeError, "Tracer.start: could not record the initial stack");
        return NULL;
    }
    int hooked = 0;
#if APROF_EVAL
    if (t->use_eval && (find_live(t, seq, lt) < 0 || install_eval(t) < 0)) {
        release_live(t);
        hooked = -1;
    }
#endif
#if !APROF_MONITORING
    if (!t->use_eval)
        hooked = install_311(t);
#endif
    if (hooked < 0) {
        t->active = 0;
        Py_DECREF(seq);
        return NULL;
    }
    Py_DECREF(seq);
    running_tracer = t;
#if APROF_EVAL
    eval_sync();
#endif
    Py_RETURN_NONE;
}

static PyObject *
Tracer_stop(Tracer *t, PyObject *Py_UNUSED(ignored))
{
    if (t->active) {
        read_pair(&t->calib[2], &t->calib[3]);
    }
    t->active = 0;
#if !APROF_MONITORING
    uninstall_311(t);
#endif
#if APROF_EVAL
    uninstall_eval(t);
#endif
    if (running_tracer == t)
        running_tracer = NULL;
#if APROF_EVAL
    eval_sync();
#endif
    Py_CLEAR(t->pos);
    Py_CLEAR(t->neg);
    Py_RETURN_NONE;
}

/* map_ticks: events buf[0..len) (the first delta counting from start
 * ticks), their times rewritten in place through the calibration pairs c
 * (ticks and ns at start, ticks and ns at the end of the stretch); returns
 * the start in ns. */
static uint64_t
map_ticks(RawEvent *buf, Py_ssize_t len, uint64_t start, uint64_t *c)
{
    if (c[2] <= c[0]) { /* no usable stop reading: assume 1 tick = 1 ns */
        c[2] = c[0] + 1;
        c[3] = c[1] + 1;
    }
    double scale = (double)(c[3] - c[1]) / (double)(c[2] - c[0]);
    uint64_t ticks = start, prev = c[1];
    for (Py_ssize_t i = 0; i < len; i++) {
        RawEvent *e = &buf[i];
        if ((e->word & 15) == EV_TIME) {
            ticks = e->payload;
            int64_t off = (int64_t)(ticks - c[0]);
            prev = e->payload = c[1] + (uint64_t)(int64_t)((double)off * scale);
            continue;
        }
        ticks += e->word >> 32;
        int64_t off = (int64_t)(ticks - c[0]);
        uint64_t ns = c[1] + (uint64_t)(int64_t)((double)off * scale);
        uint64_t d = ns > prev ? ns - prev : 0;
        if (d > 0xFFFFFFFFu)
            d = 0xFFFFFFFFu;
        prev += d;
        e->word = (e->word & 0xFFFFFFFFu) | (d << 32);
    }
    return c[1];
}

/* Rewrite the buffer's times from TSC ticks to perf_counter_ns, in place:
 * each event's absolute tick count is mapped linearly through the (ticks,
 * ns) pairs read at start and stop, and its delta recomputed from the mapped
 * times (so rounding never accumulates). Returns the start in ns. */
static uint64_t
ticks_to_ns(Tracer *t)
{
    if (!use_tsc)
        return t->start_ns;
    return map_ticks(t->buf, t->len, t->start_ns, t->calib);
}

/* keep_latest: the sealed segments and the one being written, in order, as
 * one buffer (t->buf, t->len). -1 without memory (nothing is lost). */
static int
ring_join(Tracer *t)
{
    if (t->nsegs == 0)
        return 0;
    Py_ssize_t n = t->held + t->len;
    RawEvent *all = buf_alloc(n);
    if (all == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t k = 0;
    for (int i = 0; i < t->nsegs; i++) {
        memcpy(all + k, t->segs[i], (size_t)t->seg_len[i] * sizeof(RawEvent));
        k += t->seg_len[i];
        buf_free(t->segs[i], t->seg_cap + RING_SLACK);
        t->segs[i] = NULL;
    }
    if (t->len)
        memcpy(all + k, t->buf, (size_t)t->len * sizeof(RawEvent));
    buf_free(t->buf, t->cap);
    t->buf = all;
    t->len = t->cap = n;
    t->nsegs = 0;
    t->held = 0;
    return 0;
}

/* The events buf[0..len) as bytes, after the prologue of the codes'
 * default receivers when a ring let segments go (see Tracer_take). */
static PyObject *
packed(Tracer *t, const RawEvent *buf, Py_ssize_t len)
{
    Py_ssize_t pro = 0;
    if (t->let_go) {
        for (Py_ssize_t c = 0; c < t->recv_cap; c++)
            pro += t->recv_first[c] != 0;
    }
    PyObject *data = PyBytes_FromStringAndSize(NULL, (len + 2 * pro) * (Py_ssize_t)sizeof(RawEvent));
    if (data == NULL)
        return NULL;
    RawEvent *out = (RawEvent *)PyBytes_AS_STRING(data);
    if (pro) {
        for (Py_ssize_t c = 0, left = pro; c < t->recv_cap && left > 0; c++) {
            if (t->recv_first[c] == 0)
                continue;
            left--;
            out->word = EV_RECV;
            (out++)->payload = t->recv_first[c] - 1;
            out->word = EV_CALL;
            (out++)->payload = (uint64_t)c;
        }
    }
    if (len)
        memcpy(out, buf, (size_t)len * sizeof(RawEvent));
    return data;
}

/* A copy of what take() would give, recording on (a flight recorder's
 * dump): the segments and the one being written joined into a copy, its
 * times mapped through a (ticks, ns) pair read now, the object table
 * copied. The tracer writes with the GIL held, so the copy is of whole
 * events; calls still open end past the copy, as at a stop. */
static PyObject *
Tracer_peek(Tracer *t, PyObject *Py_UNUSED(ignored))
{
    if (!t->active) {
        PyErr_SetString(PyExc_RuntimeError, "Tracer.peek: the tracer is not running");
        return NULL;
    }
    Py_ssize_t n = t->held + t->len;
    RawEvent *copy = PyMem_Malloc((size_t)Py_MAX(n, 1) * sizeof(RawEvent));
    if (copy == NULL)
        return PyErr_NoMemory();
    Py_ssize_t k = 0;
    for (int i = 0; i < t->nsegs; i++) {
        memcpy(copy + k, t->segs[i], (size_t)t->seg_len[i] * sizeof(RawEvent));
        k += t->seg_len[i];
    }
    if (t->len)
        memcpy(copy + k, t->buf, (size_t)t->len * sizeof(RawEvent));
    uint64_t start = t->start_ns;
    if (use_tsc) {
        uint64_t c[4] = {t->calib[0], t->calib[1], 0, 0};
        read_pair(&c[2], &c[3]);
        start = map_ticks(copy, n, t->start_ns, c);
    }
    PyObject *data = packed(t, copy, n);
    PyMem_Free(copy);
    if (data == NULL)
        return NULL;
    PyObject *objs = PyList_GetSlice(t->objs, 0, PY_SSIZE_T_MAX);
    if (objs == NULL) {
        Py_DECREF(data);
        return NULL;
    }
    return Py_BuildValue("(NNK)", data, objs, (unsigned long long)start);
}

/* The recorded data, handed over once: (packed events, objects, start_ns).
 * The tracer keeps nothing afterwards.
 *
 * When a ring let segments go, the first RECV of a code (its default
 * receiver, see section 4) may have gone with them: the data then starts
 * with a prologue of (RECV, CALL) pairs, one per code that has a default,
 * written before any SWITCH, so replay takes the defaults and records no
 * call. */
static PyObject *
Tracer_take(Tracer *t, PyObject *Py_UNUSED(ignored))
{
    if (t->active) {
        PyErr_SetString(PyExc_RuntimeError, "Tracer.take: stop the tracer first");
        return NULL;
    }
    if (ring_join(t) < 0)
        return NULL;
    uint64_t start = ticks_to_ns(t);
    PyObject *data = packed(t, t->buf, t->len);
    if (data == NULL)
        return NULL;
    PyObject *objs = t->objs ? t->objs : PyList_New(0);
    if (objs == NULL) {
        Py_DECREF(data);
        return NULL;
    }
    t->objs = PyList_New(0);
    buf_free(t->buf, t->cap);
    t->buf = NULL;
    t->cap = t->len = t->limit = 0;
    t->head = t->let_go = 0;
    PyMem_Free(t->table);
    t->table = NULL;
    t->table_size = t->table_used = 0;
    PyMem_Free(t->recv_first);
    t->recv_first = NULL;
    t->recv_cap = 0;
    inst_release(t);
    release_threads(t);
    t->gen = next_gen++; /* thread-local marks of this run are stale now */
    return Py_BuildValue("(NNK)", data, objs, (unsigned long long)start);
}

static PyObject *
Tracer_get_dropped(Tracer *t, void *closure)
{
    return PyLong_FromSsize_t(t->dropped);
}

static PyObject *
Tracer_get_count(Tracer *t, void *closure)
{
    return PyLong_FromSsize_t(t->held + t->len);
}

static PyObject *
Tracer_get_active(Tracer *t, void *closure)
{
    return PyBool_FromLong(t->active);
}

static PyObject *
Tracer_get_degraded(Tracer *t, void *closure)
{
#if APROF_EVAL
    return PyBool_FromLong(t->degraded);
#else
    Py_RETURN_FALSE;
#endif
}

/* ------------------------------------------------------------------------ */
/* 7. Replay's inner loop                                                    */
/* ------------------------------------------------------------------------ */

/*
 * replay(data, names, lts, start_ns, scope): the loop of
 * aprof/_post/_replay.py in C (that file keeps the same loop in Python for
 * the twin, and documents it). names[i] is the display name of object i (or
 * None), lts[i] the (list, id) of logical thread i (or None). A call
 * takes a slot of a RangeBlock of `scope` ranges (_cblocks.c), one block
 * per logical thread, appended to its list when its first call opens; the
 * call's end is written into that slot when it closes.
 */
typedef struct {
    uint64_t *keys;
    Py_ssize_t *idxs;
    Py_ssize_t n, cap;
} Stack;

#define REPLAY_SEARCH 32

/* Logical thread `lt`'s block in `blocks` (borrowed), made and appended to
 * the thread's list at its first call; its id in tids[lt]. NULL with an
 * exception set. */
static RangeBlock *
replay_block(RangeBlock **blocks, long long *tids, PyObject *lts, int32_t lt, PyObject *scope)
{
    if (blocks[lt] != NULL)
        return blocks[lt];
    PyObject *pair = PyList_GET_ITEM(lts, lt);
    if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2 || !PyList_Check(PyTuple_GET_ITEM(pair, 0))) {
        PyErr_SetString(PyExc_TypeError, "replay: lts[i] is not a (list, id) pair");
        return NULL;
    }
    long long tid = PyLong_AsLongLong(PyTuple_GET_ITEM(pair, 1));
    if (tid == -1 && PyErr_Occurred())
        return NULL;
    RangeBlock *b = aprof_block_new(scope);
    if (b == NULL)
        return NULL;
    if (PyList_Append(PyTuple_GET_ITEM(pair, 0), (PyObject *)b) < 0) {
        Py_DECREF(b);
        return NULL;
    }
    tids[lt] = tid;
    return blocks[lt] = b; /* the reference is dropped when replay ends; the list keeps the block */
}

/* The name of a method frame of code `code` on receiver `recv` (object
 * indexes), cached in `cache`; recv_name(code, recv) names it. Borrowed
 * from the cache, NULL on error. */
static PyObject *
receiver_name(PyObject *cache, PyObject *recv_name, uint64_t code, uint64_t recv)
{
    PyObject *key = PyLong_FromUnsignedLongLong((code << 32) | recv);
    if (key == NULL)
        return NULL;
    PyObject *name = PyDict_GetItemWithError(cache, key);
    if (name == NULL && !PyErr_Occurred()) {
        PyObject *made = PyObject_CallFunction(recv_name, "KK", (unsigned long long)code, (unsigned long long)recv);
        if (made != NULL && PyDict_SetItem(cache, key, made) == 0)
            name = made;
        Py_XDECREF(made); /* the cache holds it */
    }
    Py_DECREF(key);
    return name;
}

static PyObject *
ctracer_replay(PyObject *module, PyObject *args)
{
    Py_buffer buf;
    PyObject *names, *lts, *scope, *recv_name;
    unsigned long long start;
    if (!PyArg_ParseTuple(args, "y*O!O!KUO", &buf, &PyList_Type, &names, &PyList_Type, &lts, &start, &scope, &recv_name))
        return NULL;
    Py_ssize_t nobj = PyList_GET_SIZE(names);
    if (PyList_GET_SIZE(lts) != nobj) {
        PyBuffer_Release(&buf);
        PyErr_SetString(PyExc_ValueError, "replay: names and lts differ in length");
        return NULL;
    }
    Stack *stacks = PyMem_Calloc(nobj ? nobj : 1, sizeof(Stack));
    RangeBlock **blocks = PyMem_Calloc(nobj ? nobj : 1, sizeof(RangeBlock *));
    long long *tids = PyMem_Calloc(nobj ? nobj : 1, sizeof(long long));
    /* per code object: its default receiver (+1), the first EV_RECV seen */
    uint32_t *recv_default = PyMem_Calloc(nobj ? nobj : 1, sizeof(uint32_t));
    PyObject *recv_cache = PyDict_New();
    int32_t cur[MAX_THREADS];
    for (int i = 0; i < MAX_THREADS; i++)
        cur[i] = -1;
    if (stacks == NULL || blocks == NULL || tids == NULL || recv_default == NULL || recv_cache == NULL) {
        PyMem_Free(stacks);
        PyMem_Free(blocks);
        PyMem_Free(tids);
        PyMem_Free(recv_default);
        Py_XDECREF(recv_cache);
        PyBuffer_Release(&buf);
        return PyErr_NoMemory();
    }
    uint64_t pending_recv = 0; /* +1, from the EV_RECV right before a CALL */
    const RawEvent *ev = (const RawEvent *)buf.buf;
    Py_ssize_t n = buf.len / (Py_ssize_t)sizeof(RawEvent);
    uint64_t t = start;
    int ok = 1;
    PyObject *pending_exc = Py_None; /* name from the last EXC event (borrowed) */
    for (Py_ssize_t i = 0; i < n && ok; i++) {
        uint64_t w = ev[i].word, p = ev[i].payload;
        int tag = (int)(w & 15), tidx = (int)((w >> 4) & 0xFFF);
        t += w >> 32;
        if (tag == EV_TIME) {
            t = p;
            continue;
        }
        if (p >= (uint64_t)nobj)
            continue;
        if (tag == EV_EXC) {
            pending_exc = PyList_GET_ITEM(names, (Py_ssize_t)p);
            if (pending_exc != Py_None && !PyUnicode_CheckExact(pending_exc))
                pending_exc = Py_None; /* a block holds exact strs only; _replay.replay passes no other */
            continue;
        }
        if (tag == EV_RECV) {
            pending_recv = p + 1;
            continue;
        }
        if (tag == EV_SWITCH) {
            if (PyList_GET_ITEM(lts, (Py_ssize_t)p) != Py_None)
                cur[tidx] = (int32_t)p;
            continue;
        }
        /* a CALL's receiver: the RECV right before it, else its code's
         * default (set by the code's first RECV, as the tracer did) */
        uint64_t recv = 0;
        if (tag == EV_CALL) {
            recv = pending_recv;
            if (recv == 0)
                recv = recv_default[p];
            else if (recv_default[p] == 0)
                recv_default[p] = (uint32_t)recv;
        }
        pending_recv = 0;
        int32_t lt = cur[tidx];
        if (lt < 0)
            continue;
        Stack *st = &stacks[lt];
        if (tag == EV_CALL || tag == EV_CCALL) {
            PyObject *name = PyList_GET_ITEM(names, (Py_ssize_t)p);
            if (name == Py_None)
                continue;
            if (recv != 0 && (name = receiver_name(recv_cache, recv_name, p, recv - 1)) == NULL) {
                ok = 0;
                break;
            }
            if (st->n == st->cap) {
                Py_ssize_t cap = st->cap ? st->cap * 2 : 64;
                uint64_t *k = PyMem_Realloc(st->keys, cap * sizeof(uint64_t));
                if (k == NULL) {
                    PyErr_NoMemory();
                    ok = 0;
                    break;
                }
                st->keys = k;
                Py_ssize_t *x = PyMem_Realloc(st->idxs, cap * sizeof(Py_ssize_t));
                if (x == NULL) {
                    PyErr_NoMemory();
                    ok = 0;
                    break;
                }
                st->idxs = x;
                st->cap = cap;
            }
            RangeBlock *b = replay_block(blocks, tids, lts, lt, scope);
            Py_ssize_t slot;
            if (b == NULL || !PyUnicode_CheckExact(name)) { /* names are exact strs: _replay.replay sees to it */
                if (b != NULL)
                    PyErr_SetString(PyExc_TypeError, "replay: a call's name is not an exact str");
                ok = 0;
                break;
            }
            if ((slot = aprof_block_open(b, name, Py_None)) < 0) {
                ok = 0;
                break;
            }
            b->slots[slot].start = (int64_t)t;
            st->keys[st->n] = p;
            st->idxs[st->n] = slot;
            st->n++;
            continue;
        }
        /* a return of some kind: close the innermost matching call, and
         * anything opened above it (bounded search; unmatched: skipped); an
         * UNWIND carries the name of the EXC event before it */
        PyObject *exc = tag == EV_UNWIND ? pending_exc : Py_None;
        pending_exc = Py_None;
        for (Py_ssize_t j = st->n - 1; j >= 0 && j >= st->n - REPLAY_SEARCH; j--) {
            if (st->keys[j] != p)
                continue;
            /* an open call has a block: its CALL made it */
            for (Py_ssize_t k = st->n - 1; k >= j; k--)
                aprof_block_close(blocks[lt], st->idxs[k], (int64_t)t, tids[lt], k == j ? exc : Py_None);
            st->n = j;
            break;
        }
    }
    for (Py_ssize_t i = 0; i < nobj; i++) {
        PyMem_Free(stacks[i].keys);
        PyMem_Free(stacks[i].idxs);
    }
    PyMem_Free(stacks);
    for (Py_ssize_t i = 0; i < nobj; i++)
        Py_XDECREF(blocks[i]);
    PyMem_Free(blocks);
    PyMem_Free(tids);
    PyMem_Free(recv_default);
    Py_DECREF(recv_cache);
    PyBuffer_Release(&buf);
    if (!ok)
        return NULL;
    Py_RETURN_NONE;
}

#if !APROF_MONITORING
static int
noop_profile_func(PyObject *obj, PyFrameObject *frame, int what, PyObject *arg)
{
    return 0;
}
#endif

/* _noop_profile(on): the floor of the 3.11 tracer with C calls, for the
 * bench: a C profile function that returns at once (what any profile
 * function costs 3.11 before it does anything). */
static PyObject *
ctracer_noop_profile(PyObject *module, PyObject *on)
{
#if !APROF_MONITORING
    int r = PyObject_IsTrue(on);
    if (r < 0)
        return NULL;
    PyEval_SetProfile(r ? noop_profile_func : NULL, NULL);
    Py_RETURN_NONE;
#else
    PyErr_SetString(PyExc_RuntimeError, "_noop_profile: 3.11 only (3.12+: register do-nothing sys.monitoring callbacks)");
    return NULL;
#endif
}

#if APROF_EVAL
/* The floor of the frame evaluator: one that runs every frame with the
 * default evaluator (as aprof's does, the C recursion units given back on
 * 3.12) and records nothing. */
static PyObject *
noop_eval_frame(PyThreadState *tstate, struct _PyInterpreterFrame *f, int throwflag)
{
    return eval_default(tstate, f, throwflag);
}
#endif

/* _noop_evaluator(on): for the bench, 3.11 and 3.12 (see above). */
static PyObject *
ctracer_noop_evaluator(PyObject *module, PyObject *on)
{
#if APROF_EVAL
    int r = PyObject_IsTrue(on);
    if (r < 0)
        return NULL;
    PyInterpreterState *interp = PyInterpreterState_Get();
    _PyFrameEvalFunction cur = _PyInterpreterState_GetEvalFrameFunc(interp);
    if (r && cur != _PyEval_EvalFrameDefault && cur != noop_eval_frame) {
        PyErr_SetString(PyExc_RuntimeError, "_noop_evaluator: another frame evaluator is installed");
        return NULL;
    }
    if (r || cur == noop_eval_frame)
        _PyInterpreterState_SetEvalFrameFunc(interp, r ? noop_eval_frame : _PyEval_EvalFrameDefault);
    Py_RETURN_NONE;
#else
    PyErr_SetString(PyExc_RuntimeError, "_noop_evaluator: 3.11 and 3.12 only (aprof uses no frame evaluator on 3.13+)");
    return NULL;
#endif
}

static PyObject *
Tracer_get_evaluator(Tracer *t, void *closure)
{
    return PyBool_FromLong(t->use_eval);
}

/* Is the interpreter's frame evaluator another tool's (PEP 523)? Then the
 * tracer without C calls cannot start on 3.11 and 3.12 (see install_eval). */
static PyObject *
ctracer_foreign_frame_evaluator(PyObject *module, PyObject *Py_UNUSED(ignored))
{
#if APROF_EVAL
    _PyFrameEvalFunction cur = foreign_evaluator(PyInterpreterState_Get());
    if (cur != NULL)
        return PyUnicode_FromFormat("the function at %p", (void *)cur);
#endif
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"foreign_frame_evaluator", ctracer_foreign_frame_evaluator, METH_NOARGS,
     "A description of another tool's PEP 523 frame evaluator, or None."},
    {"replay", (PyCFunction)ctracer_replay, METH_VARARGS, "Replay's inner loop (see aprof/_post/_replay.py)."},
    {"_noop_profile", ctracer_noop_profile, METH_O, "3.11: a do-nothing C profile function (the bench's floor)."},
    {"_noop_evaluator", ctracer_noop_evaluator, METH_O,
     "3.11 and 3.12: a do-nothing PEP 523 frame evaluator (the bench's floor)."},
    {NULL, NULL, 0, NULL},
};

static PyMethodDef Tracer_methods[] = {
    {"start", (PyCFunction)Tracer_start, METH_O, "Start recording; initial: code objects on the stack, outermost first."},
    {"stop", (PyCFunction)Tracer_stop, METH_NOARGS, "Stop recording."},
    {"take", (PyCFunction)Tracer_take, METH_NOARGS, "Hand over (packed events, objects, start_ns)."},
    {"peek", (PyCFunction)Tracer_peek, METH_NOARGS, "A copy of (packed events, objects, start_ns), recording on."},
#if !APROF_MONITORING
    {"_thread_hook", (PyCFunction)(void (*)(void))Tracer_thread_hook, METH_FASTCALL, NULL},
#endif
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Tracer_getset[] = {
    {"dropped", (getter)Tracer_get_dropped, NULL, "Events not recorded because the buffer was full.", NULL},
    {"count", (getter)Tracer_get_count, NULL, "Raw events in the buffer.", NULL},
    {"active", (getter)Tracer_get_active, NULL, "Whether the tracer is recording.", NULL},
    {"degraded", (getter)Tracer_get_degraded, NULL,
     "Whether the C stack ran low under the frame evaluator (3.11 and 3.12 without C calls) and the profile "
     "function (3.11) or the sys.monitoring callbacks (3.12) took over.",
     NULL},
    {"evaluator", (getter)Tracer_get_evaluator, NULL,
     "Whether the tracer records Python frames through a PEP 523 frame evaluator (3.11 and 3.12 without C "
     "calls).",
     NULL},
#if APROF_MONITORING
#define HOOK_GETTER(i, name) {name, (getter)Tracer_get_hook, NULL, "A sys.monitoring callback (see Hook).", &hook_defs[i]}
    HOOK_GETTER(0, "py_start"), HOOK_GETTER(1, "py_resume"), HOOK_GETTER(2, "py_throw"),
    HOOK_GETTER(3, "py_return"), HOOK_GETTER(4, "py_yield"), HOOK_GETTER(5, "py_unwind"),
    HOOK_GETTER(6, "call"), HOOK_GETTER(7, "c_return"), HOOK_GETTER(8, "c_raise"),
#undef HOOK_GETTER
#endif
    {NULL},
};

static PyTypeObject TracerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "aprof._ctracer.Tracer",
    .tp_basicsize = sizeof(Tracer),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The Python tracer's recording half (see aprof/_ctracer.pyi).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Tracer_init,
    .tp_dealloc = (destructor)Tracer_dealloc,
    .tp_traverse = (traverseproc)Tracer_traverse,
    .tp_clear = (inquiry)Tracer_clear,
    .tp_methods = Tracer_methods,
    .tp_getset = Tracer_getset,
};

static struct PyModuleDef ctracer_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "aprof._ctracer",
    .m_doc = "aprof's C hot path: the Python tracer (SPEC 8.1), the range fast path (SPEC 3), consolidation (SPEC 6) and "
             "the sampler (SPEC 8.4).",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC
PyInit__ctracer(void)
{
    if (PyType_Ready(&TracerType) < 0)
        return NULL;
#if APROF_MONITORING
    if (PyType_Ready(&HookType) < 0)
        return NULL;
#endif
    detect_tsc();
    str_recorder = PyUnicode_InternFromString("recorder");
    str_enabled = PyUnicode_InternFromString("enabled");
    str_locals_tail = PyUnicode_InternFromString("<locals>");
    str_co_filename = PyUnicode_InternFromString("co_filename");
    if (str_recorder == NULL || str_enabled == NULL || str_locals_tail == NULL || str_co_filename == NULL)
        return NULL;
#if APROF_MONITORING
    PyObject *sys = PyImport_ImportModule("sys");
    if (sys == NULL)
        return NULL;
    PyObject *mon = PyObject_GetAttrString(sys, "monitoring");
    Py_DECREF(sys);
    if (mon == NULL)
        return NULL;
    disable_sentinel = PyObject_GetAttrString(mon, "DISABLE");
    monitoring = mon;
    if (disable_sentinel == NULL)
        return NULL;
#endif
    PyObject *m = PyModule_Create(&ctracer_module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "Tracer", (PyObject *)&TracerType) < 0 ||
        PyModule_AddIntConstant(m, "EVENT_BYTES", (long)sizeof(RawEvent)) < 0 ||
        aprof_ranges_init(m) < 0 || aprof_events_init(m) < 0 || aprof_tasks_init(m) < 0 ||
        aprof_sampler_init(m) < 0 || aprof_blocks_init(m) < 0 || aprof_memory_init(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
