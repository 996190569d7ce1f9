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
 *   4. The per-event path     - context check, logical thread, push
 *   5. Event sources          - 3.11: a C profile function on every thread;
 *                               3.12+: C callables for sys.monitoring
 *   6. The Tracer type and module
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
#include <time.h>

#if PY_VERSION_HEX >= 0x030C0000
#define APROF_MONITORING 1
#else
#define APROF_MONITORING 0
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
};

#define MAX_THREADS 4096
#define IGNORED_FLAG ((uint32_t)1 << 31)

static inline uint64_t
now_ns(void)
{
    /* time.perf_counter_ns() reads CLOCK_MONOTONIC on Linux: the tracer's
     * times must be on the same clock as ranges and task steps. */
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
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
    int32_t own_lt;        /* object index of the thread's own logical thread */
    int32_t cur_lt;        /* logical thread of the last event written, -1 none */
    PyObject *last_val;    /* last value seen in the logical-thread variable */
    int32_t last_lt;       /* what it resolved to */
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
    uint64_t last_ns, start_ns;
    Py_ssize_t dropped;
    /* object table */
    PyObject *objs;          /* list */
    Slot *table;
    size_t table_size, table_used;
    /* threads */
    ThreadSlot *threads;
    int nthreads;
    PyObject *prev_thread_hook;
    int installed_311;
} Tracer;

static uint64_t next_gen = 1;
static _Thread_local uint64_t tl_gen = 0;
static _Thread_local int tl_tidx = 0;
static PyObject *str_recorder;
static PyObject *str_co_filename;
static Tracer *running_tracer = NULL; /* at most one at a time */

static inline size_t
hash_ptr(void *p, size_t mask)
{
    uint64_t x = (uint64_t)(uintptr_t)p;
    x = (x >> 4) * 0x9E3779B97F4A7C15ull;
    return (size_t)(x >> 32) & mask;
}

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
table_add(Tracer *t, void *key, PyObject *desc, int ignored)
{
    if ((t->table_used + 1) * 2 > t->table_size && table_grow(t) < 0)
        return -1;
    Py_ssize_t idx = PyList_GET_SIZE(t->objs);
    if (PyList_Append(t->objs, desc) < 0)
        return -1;
    uint32_t value = (uint32_t)idx | (ignored ? IGNORED_FLAG : 0);
    size_t j = hash_ptr(key, t->table_size - 1);
    while (t->table[j].key != NULL)
        j = (j + 1) & (t->table_size - 1);
    t->table[j].key = key;
    t->table[j].value = value;
    t->table_used++;
    return value;
}

static inline int64_t
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

/* A code object's index; its first sight decides whether it is aprof's own. */
static inline int64_t
code_index(Tracer *t, PyObject *code)
{
    int64_t v = table_get(t, code);
    if (v != -2)
        return v;
    int ignored = 0;
    PyObject *fn = PyObject_GetAttr(code, str_co_filename);
    if (fn == NULL)
        return -1;
    if (PyUnicode_Check(fn) && PyUnicode_GET_LENGTH(t->ignore_prefix) > 0) {
        int r = PyUnicode_Tailmatch(fn, t->ignore_prefix, 0, PY_SSIZE_T_MAX, -1);
        if (r < 0) {
            Py_DECREF(fn);
            return -1;
        }
        ignored = r;
    }
    Py_DECREF(fn);
    return table_add(t, code, code, ignored);
}

/* The key of a C callable: its PyMethodDef, which is static, so a bound
 * method made per call (lst.append) maps to one entry. Only builtin
 * functions and method descriptors are recorded as C calls. */
static inline void *
cfunc_key(PyObject *callable)
{
    if (PyCFunction_Check(callable))
        return ((PyCFunctionObject *)callable)->m_ml;
    if (Py_IS_TYPE(callable, &PyMethodDescr_Type))
        return ((PyMethodDescrObject *)callable)->d_method;
    return NULL;
}

static int64_t
cfunc_index(Tracer *t, PyObject *callable, void *key)
{
    int64_t v = table_get(t, key);
    if (v != -2)
        return v;
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
    int64_t r = table_add(t, key, desc, 0);
    Py_DECREF(desc);
    return r;
}

/* ------------------------------------------------------------------------ */
/* 3. Per-OS-thread slots                                                    */
/* ------------------------------------------------------------------------ */

static ThreadSlot *
new_thread_slot(Tracer *t)
{
    if (t->nthreads >= MAX_THREADS)
        return NULL;
    PyObject *lt = PyObject_CallNoArgs(t->thread_lt);
    if (lt == NULL)
        return NULL;
    int64_t idx = table_get(t, lt);
    if (idx == -2)
        idx = table_add(t, lt, lt, 0);
    Py_DECREF(lt);
    if (idx < 0)
        return NULL;
    ThreadSlot *ts = PyMem_Realloc(t->threads, sizeof(ThreadSlot) * (t->nthreads + 1));
    if (ts == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    t->threads = ts;
    ThreadSlot *s = &ts[t->nthreads];
    s->tidx = t->nthreads;
    s->ident = PyThread_get_thread_ident();
    s->own_lt = (int32_t)idx;
    s->cur_lt = -1;
    s->last_val = NULL;
    s->last_lt = -1;
    tl_gen = t->gen;
    tl_tidx = t->nthreads;
    t->nthreads++;
    return s;
}

static inline ThreadSlot *
thread_slot(Tracer *t)
{
    if (tl_gen == t->gen)
        return &t->threads[tl_tidx];
    return new_thread_slot(t);
}

/* ------------------------------------------------------------------------ */
/* 4. The per-event path                                                     */
/* ------------------------------------------------------------------------ */

/*
 * Is the running code in the profiled context? RF_STATE holds an immutable
 * RFState per context change, shared by every task spawned afterwards, so
 * the answer is cached by the identity of that object: one
 * PyContextVar_Get (itself cached per thread state and context) and a
 * pointer compare per event, no Python call.
 */
static int
classify(Tracer *t, PyObject *state)
{
    PyObject *rec = PyObject_GetAttr(state, str_recorder);
    if (rec == NULL) {
        PyErr_Clear();
        return 0;
    }
    int ok = rec == t->recorder;
    Py_DECREF(rec);
    PyObject **slot = ok ? &t->pos : &t->neg;
    Py_INCREF(state);
    Py_XSETREF(*slot, state);
    return ok;
}

static inline int
in_context(Tracer *t)
{
    if (t->global)
        return 1;
    PyObject *v = NULL;
    if (PyContextVar_Get(t->rf_var, NULL, &v) < 0) {
        PyErr_Clear();
        return 0;
    }
    int ok;
    if (v == t->pos)
        ok = 1;
    else if (v == t->neg || v == NULL)
        ok = 0;
    else
        ok = classify(t, v);
    Py_XDECREF(v);
    return ok;
}

/*
 * Which logical thread runs this event? Tasks publish theirs in a context
 * variable when their first step starts (lt_var, set in the task's own
 * context), so this is again a cached identity check. The value records
 * the OS thread it belongs to: work that inherited a task's context in
 * another thread (to_thread, aprof.wrap) is that thread's own.
 */
static int32_t
resolve_lt(Tracer *t, ThreadSlot *ts, PyObject *v)
{
    int32_t lt = ts->own_lt;
    if (v != NULL && PyTuple_Check(v) && PyTuple_GET_SIZE(v) == 2) {
        unsigned long ident = PyLong_AsUnsignedLong(PyTuple_GET_ITEM(v, 1));
        if (ident == (unsigned long)-1 && PyErr_Occurred())
            PyErr_Clear();
        else if (ident == ts->ident) {
            PyObject *obj = PyTuple_GET_ITEM(v, 0);
            int64_t idx = table_get(t, obj);
            if (idx == -2)
                idx = table_add(t, obj, obj, 0);
            if (idx < 0)
                PyErr_Clear();
            else
                lt = (int32_t)idx;
        }
    }
    Py_XINCREF(v);
    Py_XSETREF(ts->last_val, v);
    ts->last_lt = lt;
    return lt;
}

static inline int32_t
current_lt(Tracer *t, ThreadSlot *ts)
{
    PyObject *v = NULL;
    if (PyContextVar_Get(t->lt_var, NULL, &v) < 0) {
        PyErr_Clear();
        return ts->own_lt;
    }
    int32_t lt = v == ts->last_val ? ts->last_lt : resolve_lt(t, ts, v);
    Py_XDECREF(v);
    return lt;
}

static int
grow(Tracer *t)
{
    Py_ssize_t n = t->cap ? t->cap * 2 : 65536;
    if (t->max_events && n > t->max_events + 2)
        n = t->max_events + 2;
    if (n <= t->cap)
        return -1;
    RawEvent *nb = PyMem_Realloc(t->buf, (size_t)n * sizeof(RawEvent));
    if (nb == NULL)
        return -1;
    t->buf = nb;
    t->cap = n;
    return 0;
}

/* Append one event. Bounded buffers stop recording when full (the events
 * kept are the first max_events; the rest are counted in dropped). */
static inline void
push(Tracer *t, int tag, int tidx, uint64_t payload, uint64_t now)
{
    if (t->max_events && t->len >= t->max_events) {
        t->dropped++;
        return;
    }
    if (t->len + 2 > t->cap && grow(t) < 0) {
        t->dropped++;
        return;
    }
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
    if (PyErr_Occurred())
        PyErr_WriteUnraisable((PyObject *)t);
}

/* Record one event whose object-table entry is idx (already looked up). */
static inline int
record(Tracer *t, int tag, int64_t idx, uint64_t now)
{
    if (idx < 0) {
        fail(t);
        return 0;
    }
    if (idx & IGNORED_FLAG)
        return 0;
    ThreadSlot *ts = thread_slot(t);
    if (ts == NULL) {
        fail(t);
        return 0;
    }
    int32_t lt = current_lt(t, ts);
    if (lt != ts->cur_lt) {
        ts->cur_lt = lt;
        push(t, EV_SWITCH, ts->tidx, (uint64_t)lt, now);
    }
    push(t, tag, ts->tidx, (uint64_t)idx, now);
    return 0;
}

static inline int
on_code(Tracer *t, int tag, PyObject *code)
{
    if (!t->active || !in_context(t))
        return 0;
    uint64_t now = now_ns();
    return record(t, tag, code_index(t, code), now);
}

/* A C call: skipped when made by aprof's own code (the caller's code is
 * ignored), so aprof's bookkeeping does not show up in the trace. */
static inline int
on_cfunc(Tracer *t, int tag, PyObject *caller, PyObject *callable)
{
    if (!t->active)
        return 0;
    void *key = cfunc_key(callable);
    if (key == NULL || !in_context(t))
        return 0;
    uint64_t now = now_ns();
    int64_t c = code_index(t, caller);
    if (c < 0) {
        fail(t);
        return 0;
    }
    if (c & IGNORED_FLAG)
        return 0;
    return record(t, tag, cfunc_index(t, callable, key), now);
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
    int r = 0;
    switch (what) {
    case PyTrace_CALL:
    case PyTrace_RETURN:
        code = (PyObject *)PyFrame_GetCode(frame);
        r = on_code(t, what == PyTrace_CALL ? EV_CALL : (arg == NULL ? EV_UNWIND : EV_RETURN), code);
        Py_DECREF(code);
        return r;
    case PyTrace_C_CALL:
    case PyTrace_C_RETURN:
    case PyTrace_C_EXCEPTION:
        code = (PyObject *)PyFrame_GetCode(frame);
        r = on_cfunc(t, what == PyTrace_C_CALL ? EV_CCALL : (what == PyTrace_C_RETURN ? EV_CRETURN : EV_CRAISE), code,
                     arg);
        Py_DECREF(code);
        return r;
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

#if APROF_MONITORING
/* 3.12+: sys.monitoring callbacks, called through vectorcall with the code
 * object (no frame object is made). Registered by aprof/_core/_tracer.py. */
#define ARG_CODE(args) (args[0])

static PyObject *
Tracer_py_start(Tracer *t, PyObject *const *args, Py_ssize_t nargs)
{
    on_code(t, EV_CALL, ARG_CODE(args));
    Py_RETURN_NONE;
}

static PyObject *
Tracer_py_return(Tracer *t, PyObject *const *args, Py_ssize_t nargs)
{
    on_code(t, EV_RETURN, ARG_CODE(args));
    Py_RETURN_NONE;
}

static PyObject *
Tracer_py_unwind(Tracer *t, PyObject *const *args, Py_ssize_t nargs)
{
    on_code(t, EV_UNWIND, ARG_CODE(args));
    Py_RETURN_NONE;
}

static PyObject *disable_sentinel; /* sys.monitoring.DISABLE */

/* CALL fires for every call; only C callables are recorded here (Python
 * ones get PY_START). A call site that calls a Python function is switched
 * off for CALL (and so for its C_RETURN), which halves the callbacks of
 * Python-heavy code; a site that calls both loses its C calls. */
static PyObject *
Tracer_call(Tracer *t, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 3)
        Py_RETURN_NONE;
    PyObject *callable = args[2];
    if (PyFunction_Check(callable) || PyMethod_Check(callable))
        return Py_NewRef(disable_sentinel);
    on_cfunc(t, EV_CCALL, ARG_CODE(args), callable);
    Py_RETURN_NONE;
}

static PyObject *
Tracer_c_return(Tracer *t, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs >= 3)
        on_cfunc(t, EV_CRETURN, ARG_CODE(args), args[2]);
    Py_RETURN_NONE;
}

static PyObject *
Tracer_c_raise(Tracer *t, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs >= 3)
        on_cfunc(t, EV_CRAISE, ARG_CODE(args), args[2]);
    Py_RETURN_NONE;
}
#endif

/* ------------------------------------------------------------------------ */
/* 6. The Tracer type                                                        */
/* ------------------------------------------------------------------------ */

static int
Tracer_init(Tracer *t, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"rf_state", "recorder", "lt_var", "thread_lt", "ignore_prefix", "max_events", NULL};
    PyObject *rf_var, *recorder, *lt_var, *thread_lt, *prefix;
    Py_ssize_t max_events = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOOU|n", kwlist, &rf_var, &recorder, &lt_var, &thread_lt, &prefix,
                                     &max_events))
        return -1;
    if (!PyContextVar_CheckExact(rf_var) || !PyContextVar_CheckExact(lt_var)) {
        PyErr_SetString(PyExc_TypeError, "Tracer: rf_state and lt_var must be ContextVars");
        return -1;
    }
    if (max_events < 0) {
        PyErr_SetString(PyExc_ValueError, "Tracer: max_events must be >= 0");
        return -1;
    }
    Py_XSETREF(t->rf_var, Py_NewRef(rf_var));
    Py_XSETREF(t->recorder, Py_NewRef(recorder));
    Py_XSETREF(t->lt_var, Py_NewRef(lt_var));
    Py_XSETREF(t->thread_lt, Py_NewRef(thread_lt));
    Py_XSETREF(t->ignore_prefix, Py_NewRef(prefix));
    t->global = recorder == Py_None;
    t->max_events = max_events;
    if (t->objs == NULL && (t->objs = PyList_New(0)) == NULL)
        return -1;
    t->gen = next_gen++;
    return 0;
}

static void
release_threads(Tracer *t)
{
    for (int i = 0; i < t->nthreads; i++)
        Py_CLEAR(t->threads[i].last_val);
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
    for (int i = 0; i < t->nthreads; i++)
        Py_VISIT(t->threads[i].last_val);
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
    for (int i = 0; i < t->nthreads; i++)
        Py_CLEAR(t->threads[i].last_val);
    return 0;
}

static void
Tracer_dealloc(Tracer *t)
{
    PyObject_GC_UnTrack(t);
    if (running_tracer == t)
        running_tracer = NULL;
    Tracer_clear(t);
    release_threads(t);
    PyMem_Free(t->buf);
    PyMem_Free(t->table);
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
    t->start_ns = t->last_ns = now_ns();
    t->active = 1;
    /* Frames already on the stack (outermost first) open at the start time
     * (RELIABILITY LC-06); their returns close them as usual. */
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) {
        PyObject *code = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyCode_Check(code))
            continue;
        int64_t idx = code_index(t, code);
        if (idx < 0) {
            t->active = 0;
            Py_DECREF(seq);
            return NULL;
        }
        record(t, EV_CALL, idx, t->start_ns);
    }
    Py_DECREF(seq);
    if (!t->active) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_RuntimeError, "Tracer.start: could not record the initial stack");
        return NULL;
    }
#if !APROF_MONITORING
    if (install_311(t) < 0) {
        t->active = 0;
        return NULL;
    }
#endif
    running_tracer = t;
    Py_RETURN_NONE;
}

static PyObject *
Tracer_stop(Tracer *t, PyObject *Py_UNUSED(ignored))
{
    t->active = 0;
#if !APROF_MONITORING
    uninstall_311(t);
#endif
    if (running_tracer == t)
        running_tracer = NULL;
    Py_CLEAR(t->pos);
    Py_CLEAR(t->neg);
    Py_RETURN_NONE;
}

/* The recorded data, handed over once: (packed events, objects, start_ns).
 * The tracer keeps nothing afterwards. */
static PyObject *
Tracer_take(Tracer *t, PyObject *Py_UNUSED(ignored))
{
    if (t->active) {
        PyErr_SetString(PyExc_RuntimeError, "Tracer.take: stop the tracer first");
        return NULL;
    }
    PyObject *data = PyBytes_FromStringAndSize((const char *)t->buf, t->len * (Py_ssize_t)sizeof(RawEvent));
    if (data == NULL)
        return NULL;
    PyObject *objs = t->objs ? t->objs : PyList_New(0);
    if (objs == NULL) {
        Py_DECREF(data);
        return NULL;
    }
    t->objs = PyList_New(0);
    PyMem_Free(t->buf);
    t->buf = NULL;
    t->cap = t->len = 0;
    PyMem_Free(t->table);
    t->table = NULL;
    t->table_size = t->table_used = 0;
    release_threads(t);
    t->gen = next_gen++; /* thread-local marks of this run are stale now */
    return Py_BuildValue("(NNK)", data, objs, (unsigned long long)t->start_ns);
}

static PyObject *
Tracer_get_dropped(Tracer *t, void *closure)
{
    return PyLong_FromSsize_t(t->dropped);
}

static PyObject *
Tracer_get_count(Tracer *t, void *closure)
{
    return PyLong_FromSsize_t(t->len);
}

static PyObject *
Tracer_get_active(Tracer *t, void *closure)
{
    return PyBool_FromLong(t->active);
}

static PyMethodDef Tracer_methods[] = {
    {"start", (PyCFunction)Tracer_start, METH_O, "Start recording; initial: code objects on the stack, outermost first."},
    {"stop", (PyCFunction)Tracer_stop, METH_NOARGS, "Stop recording."},
    {"take", (PyCFunction)Tracer_take, METH_NOARGS, "Hand over (packed events, objects, start_ns)."},
#if APROF_MONITORING
    {"py_start", (PyCFunction)(void (*)(void))Tracer_py_start, METH_FASTCALL, NULL},
    {"py_resume", (PyCFunction)(void (*)(void))Tracer_py_start, METH_FASTCALL, NULL},
    {"py_throw", (PyCFunction)(void (*)(void))Tracer_py_start, METH_FASTCALL, NULL},
    {"py_return", (PyCFunction)(void (*)(void))Tracer_py_return, METH_FASTCALL, NULL},
    {"py_yield", (PyCFunction)(void (*)(void))Tracer_py_return, METH_FASTCALL, NULL},
    {"py_unwind", (PyCFunction)(void (*)(void))Tracer_py_unwind, METH_FASTCALL, NULL},
    {"call", (PyCFunction)(void (*)(void))Tracer_call, METH_FASTCALL, NULL},
    {"c_return", (PyCFunction)(void (*)(void))Tracer_c_return, METH_FASTCALL, NULL},
    {"c_raise", (PyCFunction)(void (*)(void))Tracer_c_raise, METH_FASTCALL, NULL},
#else
    {"_thread_hook", (PyCFunction)(void (*)(void))Tracer_thread_hook, METH_FASTCALL, NULL},
#endif
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Tracer_getset[] = {
    {"dropped", (getter)Tracer_get_dropped, NULL, "Events not recorded because the buffer was full.", NULL},
    {"count", (getter)Tracer_get_count, NULL, "Raw events in the buffer.", NULL},
    {"active", (getter)Tracer_get_active, NULL, "Whether the tracer is recording.", NULL},
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
    .m_doc = "The Python tracer's C hot path (SPEC 8.1).",
    .m_size = -1,
};

PyMODINIT_FUNC
PyInit__ctracer(void)
{
    if (PyType_Ready(&TracerType) < 0)
        return NULL;
    str_recorder = PyUnicode_InternFromString("recorder");
    str_co_filename = PyUnicode_InternFromString("co_filename");
    if (str_recorder == NULL || str_co_filename == NULL)
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
    Py_DECREF(mon);
    if (disable_sentinel == NULL)
        return NULL;
#endif
    PyObject *m = PyModule_Create(&ctracer_module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "Tracer", (PyObject *)&TracerType) < 0 ||
        PyModule_AddIntConstant(m, "EVENT_BYTES", (long)sizeof(RawEvent)) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
