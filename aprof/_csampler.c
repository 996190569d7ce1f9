/*
 * aprof._ctracer's sampler: task-aware stack samples at an interval (SPEC 8.4).
 *
 * The contract is the `Sampler` section of aprof/_ctracer.pyi; the
 * pure-Python twin is aprof/_core/_sampler_py.py, the driver
 * aprof/_core/_sampler.py, and aprof/_post/_samples.py turns the raw
 * samples into a session's sampled data at stop.
 *
 * Sections:
 *   1. The engine        - one C thread per process that ticks for every
 *                          running sampler, and how a tick gets the GIL
 *   2. Per-sampler data  - samples, the object table, the stack trie
 *   3. Taking a sample   - which threads, which logical thread, the stack
 *   4. The Sampler type and the module functions
 *
 * Why a tick runs where it does. Reading another thread's frames is safe
 * only while holding the GIL (the owner cannot change them then). A thread
 * that waits for the GIL asks the holder to drop it only after the switch
 * interval (5 ms by default), and then both threads pay a hand-off: a
 * sampler that took the GIL itself would sample a busy program every 5 ms
 * at best, and make the program's thread wait for it each time. So a tick
 * first asks the main thread to take the sample itself, between two
 * bytecodes, through Py_AddPendingCall (the mechanism signal handlers use:
 * no lock of the program's, no Python code run, a few microseconds). When
 * the main thread does not answer within a short wait (it is blocked in a
 * system call, its GIL released: the loop waiting in its selector, a
 * blocking call, a join), the engine takes the GIL, which is then free, and
 * samples itself. Either way the sample reads every thread, with the GIL.
 *
 * A sample never runs Python code and never allocates a garbage-collected
 * object (the collector could run finalizers inside it): it reads thread
 * states, frames and context variables, and appends to C arrays.
 */
#define PY_SSIZE_T_CLEAN
/* This file reads interpreter internals (frames, and on 3.11-3.12 the eval
 * breaker, see engine_tick): it is compiled as a core module, as Cython
 * and CPython's own extension modules are, so the internal headers agree
 * with Python.h. */
#define Py_BUILD_CORE_MODULE 1
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <errno.h>

#include "_cext.h"

#include "internal/pycore_frame.h"
#if PY_VERSION_HEX < 0x030D0000
#include "internal/pycore_interp.h"
#include "internal/pycore_atomic.h"
#endif

#if defined(_WIN32)
#error "aprof's sampler needs POSIX threads"
#endif
#include <pthread.h>

#if PY_VERSION_HEX >= 0x030E0000
#error "aprof's sampler reads CPython 3.11-3.13 frame and context layouts"
#endif

/* The head of CPython's struct _pycontextobject (see _ctracer.c). */
typedef struct {
    PyObject_HEAD
    PyObject *ctx_prev;
    PyObject *ctx_vars;
} SContextHead;

int
aprof_same_context_vars(PyObject *a, PyObject *b)
{
    return a != NULL && b != NULL && PyContext_CheckExact(a) && PyContext_CheckExact(b) &&
           ((SContextHead *)a)->ctx_vars == ((SContextHead *)b)->ctx_vars;
}

/* ------------------------------------------------------------------------ */
/* 2. Per-sampler data                                                       */
/* ------------------------------------------------------------------------ */

/*
 * One sample is three 64-bit words (24 bytes):
 *   w0  the time (perf_counter_ns)
 *   w1  bits 0-31 the stack (trie node, 0: empty), bits 32-63 the time since
 *       the sampler's previous tick (ns, saturated), the sample's weight
 *   w2  bits 0-31 the logical thread: an object index, or OWN_LT | the
 *       thread's slot (the OS thread's own logical thread, resolved at stop)
 *       bits 32-47 the thread's slot, bits 48-63 flags (SAMPLE_IDLE)
 *
 * Stacks are interned in a trie: node i is (parent node, code's object
 * index), node 0 the empty stack. A long-running profile keeps one node per
 * distinct call path, not one per frame per sample.
 */
#define OWN_LT ((uint32_t)1 << 31)
#define SAMPLE_IDLE 1
#define MAX_DEPTH 1024
#define MAX_SLOTS 65535

/* Object-table flags decided at first sight of a code object. */
#define F_IGNORED ((uint32_t)1 << 31) /* aprof's own code: left out of stacks */
#define F_WAIT ((uint32_t)1 << 30)    /* a loop's wait for I/O (see the driver) */
#define F_CORO ((uint32_t)1 << 29)    /* a coroutine or async generator's code */
#define F_BOOT ((uint32_t)1 << 28)    /* threading.py's: a thread's bootstrap, waits */
#define F_MASK (((uint32_t)1 << 28) - 1)

typedef struct {
    void *key;
    uint32_t value;
} SSlot;

typedef struct {
    uint64_t key; /* parent << 32 | code */
    uint32_t node;
} TrieSlot;

typedef struct {
    uint64_t ts_id;      /* the thread state's id (unique per interpreter) */
    unsigned long ident; /* threading.get_ident() of its thread */
    PyObject *last_vars; /* the context variables the answer below is for (strong) */
    int last_in;         /* is that context profiled? */
    uint32_t last_lt;    /* and its logical thread */
} SThread;

typedef struct Sampler {
    PyObject_HEAD
    /* configuration */
    PyObject *rf_var;      /* ContextVar RF_STATE */
    PyObject *recorder;    /* the profile's Recorder; None: every context (global scope) */
    PyObject *lt_var;      /* ContextVar holding (LogicalThread, ident) for a task */
    PyObject *prefix;      /* aprof's own files */
    PyObject *waits;       /* tuple of (file suffix, qualname) a loop waits in */
    uint64_t interval;     /* ns */
    Py_ssize_t max_samples;/* 0: unbounded */
    int ring;              /* keep_latest: past max_samples, a sample takes the oldest's slot */
    Py_ssize_t head;       /* the ring's oldest sample, once it is full */
    int global;
    int active;            /* between start and stop */
    int forked;            /* a forked child's copy: records nothing */
    /* the context check's identity cache (as the tracer's) */
    PyObject *pos, *neg;
    /* samples */
    uint64_t *buf;
    Py_ssize_t len, cap;   /* in samples */
    Py_ssize_t dropped, idle;
    uint64_t start_ns, last_ns, next_ns;
    /* object table */
    PyObject *objs;
    SSlot *table;
    size_t table_size, table_used;
    /* stack trie */
    uint32_t *nodes;       /* 2 per node: parent, code */
    Py_ssize_t nnodes, nodes_cap;
    TrieSlot *trie;
    size_t trie_size, trie_used;
    /* threads */
    SThread *threads;
    int nthreads;
} Sampler;

static APROF_INLINE size_t
s_hash(uint64_t x, size_t mask)
{
    x = (x >> 3) * 0x9E3779B97F4A7C15ull;
    return (size_t)(x >> 32) & mask;
}

static int
s_table_grow(Sampler *s)
{
    size_t n = s->table_size ? s->table_size * 2 : 512;
    SSlot *nt = PyMem_Calloc(n, sizeof(SSlot));
    if (nt == NULL)
        return -1;
    for (size_t i = 0; i < s->table_size; i++) {
        if (s->table[i].key == NULL)
            continue;
        size_t j = s_hash((uint64_t)(uintptr_t)s->table[i].key, n - 1);
        while (nt[j].key != NULL)
            j = (j + 1) & (n - 1);
        nt[j] = s->table[i];
    }
    PyMem_Free(s->table);
    s->table = nt;
    s->table_size = n;
    return 0;
}

static APROF_INLINE int64_t
s_table_get(Sampler *s, void *key)
{
    if (s->table_size == 0)
        return -2;
    size_t mask = s->table_size - 1;
    for (size_t j = s_hash((uint64_t)(uintptr_t)key, mask);; j = (j + 1) & mask) {
        if (s->table[j].key == key)
            return s->table[j].value;
        if (s->table[j].key == NULL)
            return -2;
    }
}

/* Add obj (kept strongly until take()) with flags; its value, -1 on error.
 * PyList_Append allocates no collected object: no finalizer can run. */
static int64_t
s_table_add(Sampler *s, PyObject *obj, uint32_t flags)
{
    if ((s->table_used + 1) * 2 > s->table_size && s_table_grow(s) < 0)
        return -1;
    Py_ssize_t idx = PyList_GET_SIZE(s->objs);
    if ((size_t)idx > F_MASK || PyList_Append(s->objs, obj) < 0)
        return -1;
    uint32_t value = (uint32_t)idx | flags;
    size_t mask = s->table_size - 1, j = s_hash((uint64_t)(uintptr_t)obj, mask);
    while (s->table[j].key != NULL)
        j = (j + 1) & mask;
    s->table[j].key = obj;
    s->table[j].value = value;
    s->table_used++;
    return value;
}

static PyObject *str_get, *str_recorder_s, *str_enabled_s, *str_threading_py;

/* Does str end with suffix? Both exact str; no exception. */
static int
ends_with(PyObject *str, PyObject *suffix)
{
    Py_ssize_t n = PyUnicode_GET_LENGTH(str), m = PyUnicode_GET_LENGTH(suffix);
    if (m > n)
        return 0;
    int r = PyUnicode_Tailmatch(str, suffix, n - m, n, 1);
    if (r < 0) {
        PyErr_Clear();
        return 0;
    }
    return r;
}

/* First sight of a code object: aprof's own? a wait point? a coroutine's? */
static APROF_NOINLINE int64_t
s_code_add(Sampler *s, PyCodeObject *co)
{
    uint32_t flags = 0;
    PyObject *fn = co->co_filename, *qn = co->co_qualname;
    if (PyUnicode_Check(fn) && PyUnicode_GET_LENGTH(s->prefix) > 0) {
        int r = PyUnicode_Tailmatch(fn, s->prefix, 0, PY_SSIZE_T_MAX, -1);
        if (r < 0)
            PyErr_Clear();
        else if (r)
            flags |= F_IGNORED;
    }
    if (PyUnicode_Check(fn) && PyUnicode_Check(qn)) {
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(s->waits); i++) {
            PyObject *w = PyTuple_GET_ITEM(s->waits, i);
            if (ends_with(fn, PyTuple_GET_ITEM(w, 0)) && PyUnicode_Compare(qn, PyTuple_GET_ITEM(w, 1)) == 0) {
                flags |= F_WAIT;
                break;
            }
        }
        if (PyErr_Occurred())
            PyErr_Clear();
    }
    if (co->co_flags & (CO_COROUTINE | CO_ITERABLE_COROUTINE | CO_ASYNC_GENERATOR))
        flags |= F_CORO;
    if (PyUnicode_Check(fn) && ends_with(fn, str_threading_py))
        flags |= F_BOOT;
    return s_table_add(s, (PyObject *)co, flags);
}

static APROF_INLINE int64_t
s_code_index(Sampler *s, PyCodeObject *co)
{
    int64_t v = s_table_get(s, co);
    return v != -2 ? v : s_code_add(s, co);
}

static int64_t
s_obj_index(Sampler *s, PyObject *obj)
{
    int64_t v = s_table_get(s, obj);
    return v != -2 ? v : s_table_add(s, obj, 0);
}

static int
trie_grow(Sampler *s)
{
    size_t n = s->trie_size ? s->trie_size * 2 : 1024;
    TrieSlot *nt = PyMem_Calloc(n, sizeof(TrieSlot));
    if (nt == NULL)
        return -1;
    for (size_t i = 0; i < s->trie_size; i++) {
        if (s->trie[i].node == 0)
            continue;
        size_t j = s_hash(s->trie[i].key * 0x100000001b3ull, n - 1);
        while (nt[j].node != 0)
            j = (j + 1) & (n - 1);
        nt[j] = s->trie[i];
    }
    PyMem_Free(s->trie);
    s->trie = nt;
    s->trie_size = n;
    return 0;
}

/* The node for (parent, code), made on first sight; 0 on error. */
static uint32_t
trie_child(Sampler *s, uint32_t parent, uint32_t code)
{
    uint64_t key = ((uint64_t)parent << 32) | code;
    if (s->trie_size) {
        size_t mask = s->trie_size - 1;
        for (size_t j = s_hash(key * 0x100000001b3ull, mask); s->trie[j].node != 0; j = (j + 1) & mask)
            if (s->trie[j].key == key)
                return s->trie[j].node;
    }
    if (s->nnodes >= (Py_ssize_t)UINT32_MAX - 1)
        return 0;
    if ((s->trie_used + 1) * 2 > s->trie_size && trie_grow(s) < 0)
        return 0;
    if (s->nnodes == s->nodes_cap) {
        Py_ssize_t cap = s->nodes_cap ? s->nodes_cap * 2 : 1024;
        uint32_t *nn = PyMem_Realloc(s->nodes, (size_t)cap * 2 * sizeof(uint32_t));
        if (nn == NULL)
            return 0;
        s->nodes = nn;
        s->nodes_cap = cap;
    }
    uint32_t node = (uint32_t)s->nnodes++;
    s->nodes[2 * node] = parent;
    s->nodes[2 * node + 1] = code;
    size_t mask = s->trie_size - 1, j = s_hash(key * 0x100000001b3ull, mask);
    while (s->trie[j].node != 0)
        j = (j + 1) & mask;
    s->trie[j].key = key;
    s->trie[j].node = node;
    s->trie_used++;
    return node;
}

static SThread *
s_thread(Sampler *s, PyThreadState *ts)
{
    uint64_t id = (uint64_t)ts->id;
    for (int i = 0; i < s->nthreads; i++)
        if (s->threads[i].ts_id == id)
            return &s->threads[i];
    if (s->nthreads >= MAX_SLOTS)
        return NULL;
    SThread *nt = PyMem_Realloc(s->threads, sizeof(SThread) * (size_t)(s->nthreads + 1));
    if (nt == NULL)
        return NULL;
    s->threads = nt;
    SThread *t = &nt[s->nthreads++];
    memset(t, 0, sizeof *t);
    t->ts_id = id;
    t->ident = ts->thread_id;
    return t;
}

/* ------------------------------------------------------------------------ */
/* 3. Taking a sample                                                        */
/* ------------------------------------------------------------------------ */


/* context.get(var), a borrowed-turned-new reference or NULL (absent). The
 * method is C (Context.get): no Python code runs, nothing is allocated. */
static PyObject *
context_lookup(PyObject *ctx, PyObject *var)
{
    PyObject *args[3] = {ctx, var, Py_None};
    PyObject *v = PyObject_VectorcallMethod(str_get, args, 3 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    if (v == NULL) {
        PyErr_Clear();
        return NULL;
    }
    if (v == Py_None) {
        Py_DECREF(v);
        return NULL;
    }
    return v;
}

/* Is a context whose RF_STATE value is `state` (NULL: never set) profiled
 * by this sampler? Recording must be on there (SPEC 3.4) and, in context
 * scope, the recorder the profile's. Cached by the RFState's identity. */
static int
s_classify(Sampler *s, PyObject *state)
{
    if (state == NULL)
        return s->global;
    if (state == s->pos)
        return 1;
    if (state == s->neg)
        return 0;
    int ok = 0;
    PyObject *en = PyObject_GetAttr(state, str_enabled_s);
    if (en != NULL) {
        ok = en == Py_True;
        Py_DECREF(en);
    }
    if (ok && !s->global) {
        PyObject *rec = PyObject_GetAttr(state, str_recorder_s);
        ok = rec != NULL && rec == s->recorder;
        Py_XDECREF(rec);
    }
    PyErr_Clear();
    Py_INCREF(state);
    Py_XSETREF(*(ok ? &s->pos : &s->neg), state);
    return ok;
}

static APROF_INLINE struct _PyInterpreterFrame *
ts_frame(PyThreadState *ts)
{
#if PY_VERSION_HEX >= 0x030D0000
    return ts->current_frame;
#else
    return ts->cframe != NULL ? ts->cframe->current_frame : NULL;
#endif
}

/* The code of a frame worth showing, or NULL (a C entry shim, a frame
 * still being set up). */
static APROF_INLINE PyCodeObject *
frame_code(struct _PyInterpreterFrame *f)
{
#if PY_VERSION_HEX >= 0x030C0000
    if (f->owner == FRAME_OWNED_BY_CSTACK)
        return NULL;
#endif
#if PY_VERSION_HEX >= 0x030D0000
    if (f->f_executable == NULL || !PyCode_Check(f->f_executable))
        return NULL;
#endif
    if (_PyFrame_IsIncomplete(f))
        return NULL;
#if PY_VERSION_HEX >= 0x030D0000
    return (PyCodeObject *)f->f_executable;
#else
    return f->f_code;
#endif
}

static void
s_append(Sampler *s, uint64_t now, uint64_t dt, uint32_t stack, uint32_t lt, int slot, int flags)
{
    uint64_t *w;
    if (s->max_samples && s->len >= s->max_samples) {
        s->dropped++;
        if (!s->ring)
            return;
        /* keep_latest: this sample takes the oldest's slot (the dropped one) */
        w = &s->buf[3 * s->head];
        s->head = s->head + 1 == s->len ? 0 : s->head + 1;
        goto write;
    }
    if (s->len == s->cap) {
        Py_ssize_t cap = s->cap ? s->cap * 2 : 4096;
        if (s->max_samples && cap > s->max_samples)
            cap = s->max_samples;
        uint64_t *nb = PyMem_Realloc(s->buf, (size_t)cap * 3 * sizeof(uint64_t));
        if (nb == NULL) {
            s->dropped++;
            return;
        }
        s->buf = nb;
        s->cap = cap;
    }
    w = &s->buf[3 * s->len++];
write:
    w[0] = now;
    w[1] = (uint64_t)stack | ((dt > 0xFFFFFFFFu ? 0xFFFFFFFFu : dt) << 32);
    w[2] = (uint64_t)lt | ((uint64_t)slot << 32) | ((uint64_t)flags << 48);
}

/*
 * One thread's sample for one sampler. The stack, innermost first while it
 * is walked, is kept from the outermost frame, except in a task: there the
 * frames below the task's coroutine are the event loop's (asyncio's
 * _run_once, trio's run loop), which ran the step, not the task. The task's
 * coroutine is the outermost coroutine of the innermost run of frames
 * owned by generators that holds one: a task's step is its coroutine and
 * the coroutines it awaits through (each frame's caller is the coroutine
 * that awaits it, the cr_await chain), and an eager task's first step,
 * which runs inside its spawner's create_task(), stops at that call. A
 * sample of a thread outside any task that is waiting where a loop waits
 * for I/O (the innermost frame is the selector's select, trio's
 * get_events, the runner of a C loop) is idle: counted, charged to nobody.
 */
static void
sample_thread(Sampler *s, PyThreadState *ts, struct _PyInterpreterFrame *top, uint64_t now, uint64_t dt)
{
    PyObject *ctx = ts->context;
    PyObject *vars = ctx != NULL ? ((SContextHead *)ctx)->ctx_vars : NULL;
    SThread *th = s_thread(s, ts);
    if (th == NULL) {
        s->dropped++;
        return;
    }
    int slot = (int)(th - s->threads);
    if (vars == NULL || vars != th->last_vars) {
        PyObject *state = ctx != NULL ? context_lookup(ctx, s->rf_var) : NULL;
        int in = s_classify(s, state);
        Py_XDECREF(state);
        uint32_t lt = OWN_LT | (uint32_t)slot;
        if (in && ctx != NULL) {
            PyObject *v = context_lookup(ctx, s->lt_var);
            if (v != NULL && PyTuple_Check(v) && PyTuple_GET_SIZE(v) == 2) {
                unsigned long ident = PyLong_AsUnsignedLong(PyTuple_GET_ITEM(v, 1));
                if (ident == (unsigned long)-1 && PyErr_Occurred())
                    PyErr_Clear();
                else if (ident == th->ident) {
                    int64_t i = s_obj_index(s, PyTuple_GET_ITEM(v, 0));
                    if (i >= 0)
                        lt = (uint32_t)i & F_MASK;
                    else
                        PyErr_Clear();
                }
            }
            Py_XDECREF(v);
        }
        th = &s->threads[slot];
        Py_XINCREF(vars);
        Py_XSETREF(th->last_vars, vars);
        th->last_in = in;
        th->last_lt = lt;
    }
    if (!th->last_in)
        return;
    uint32_t lt = th->last_lt;
    int in_task = !(lt & OWN_LT);

    uint32_t codes[MAX_DEPTH];
    unsigned char gen_owned[MAX_DEPTH];
    int n = 0, truncated = 0;
    for (struct _PyInterpreterFrame *f = top; f != NULL; f = f->previous) {
        PyCodeObject *co = frame_code(f);
        if (co == NULL)
            continue;
        if (n == MAX_DEPTH) {
            truncated = 1; /* the innermost MAX_DEPTH frames are kept */
            break;
        }
        int64_t v = s_code_index(s, co);
        if (v < 0) {
            PyErr_Clear();
            s->dropped++;
            return;
        }
        codes[n] = (uint32_t)v;
        gen_owned[n] = f->owner == FRAME_OWNED_BY_GENERATOR;
        n++;
    }
    int end = n; /* frames [0, end) are kept, innermost first */
    if (in_task) {
        int i = 0, found = 0;
        while (i < n && !found) {
            while (i < n && !gen_owned[i])
                i++;
            int cut = -1;
            for (; i < n && gen_owned[i]; i++)
                if (codes[i] & F_CORO)
                    cut = i;
            if (cut >= 0) {
                end = cut + 1;
                truncated = 0;
                found = 1;
            }
        }
        if (!found) {
            /* No coroutine on the stack: a loop callback running in a copy
             * of the task's context (call_soon copies it), not the task's
             * step. Ranges there go on the thread's track; so does this. */
            lt = OWN_LT | (uint32_t)slot;
            in_task = 0;
        }
    }
    int flags = 0;
    if (!in_task) {
        for (int i = 0; i < end; i++) {
            if (codes[i] & F_IGNORED)
                continue;
            if (codes[i] & F_WAIT)
                flags |= SAMPLE_IDLE;
            break;
        }
        /* One of aprof's own threads (a watchdog, an idle launch() worker):
         * aprof's frames on threading's bootstrap, nothing of the program. */
        int own = 0, other = 0;
        for (int i = 0; i < end; i++) {
            if (codes[i] & F_IGNORED)
                own = 1;
            else if (!(codes[i] & F_BOOT))
                other = 1;
        }
        if (own && !other)
            return;
    }
    if (flags & SAMPLE_IDLE) {
        s->idle++;
        s_append(s, now, dt, 0, lt, slot, flags);
        return;
    }
    uint32_t node = 0;
    if (truncated) {
        /* Py_None's index stands for the frames left out */
        int64_t v = s_obj_index(s, Py_None);
        if (v < 0 || (node = trie_child(s, 0, (uint32_t)v & F_MASK)) == 0) {
            PyErr_Clear();
            s->dropped++;
            return;
        }
    }
    for (int i = end - 1; i >= 0; i--) {
        if (codes[i] & F_IGNORED)
            continue;
        uint32_t next = trie_child(s, node, codes[i] & F_MASK);
        if (next == 0) {
            s->dropped++;
            return;
        }
        node = next;
    }
    s_append(s, now, dt, node, lt, slot, flags);
}

/* ------------------------------------------------------------------------ */
/* 1. The engine                                                             */
/* ------------------------------------------------------------------------ */

static struct {
    pthread_t thread;
    int thread_running;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int quit;                 /* under mu */
    uint64_t interval;        /* under mu: the shortest running sampler's */
    Sampler **samplers;       /* with the GIL: the running samplers (strong) */
    int nsamplers;
    PyThreadState *own_ts;    /* the engine thread's thread state */
    uint64_t tick;            /* the tick being taken (atomic) */
    uint64_t done;            /* the last tick sampled (atomic) */
    int pending;              /* a pending call is queued (atomic) */
    uint64_t generation;      /* bumped at fork: a stale pending call is ignored */
    uint64_t ticks, pended, direct; /* statistics, for the bench */
    uint64_t sample_ns, gil_wait_ns;
} engine;

static void sample_all_at(uint64_t now);

static void
sample_all(void)
{
    uint64_t now = now_ns();
    /* a sample's buffers are aprof's: never charged to a memory profile
     * (the main thread samples inside the program's task and range) */
    int quiet = aprof_memory_quiet(1);
    sample_all_at(now);
    aprof_memory_quiet(quiet);
    engine.sample_ns += now_ns() - now;
}

static void
sample_all_at(uint64_t now)
{
    PyThreadState *me = PyThreadState_Get();
    PyInterpreterState *interp = PyThreadState_GetInterpreter(me);
    for (int k = 0; k < engine.nsamplers; k++) {
        Sampler *s = engine.samplers[k];
        /* due within half a tick: a tick lands a little early or late */
        if (!s->active || s->forked || now + engine.interval / 2 < s->next_ns)
            continue;
        uint64_t dt = now - s->last_ns;
        s->last_ns = now;
        s->next_ns += s->interval;
        if (s->next_ns <= now)
            s->next_ns = now + s->interval / 2; /* fell behind: do not catch up in a burst */
        for (PyThreadState *ts = PyInterpreterState_ThreadHead(interp); ts != NULL; ts = PyThreadState_Next(ts)) {
            if (ts == engine.own_ts)
                continue;
            struct _PyInterpreterFrame *top = ts_frame(ts);
            if (top == NULL)
                continue;
            sample_thread(s, ts, top, now, dt);
        }
    }
    if (PyErr_Occurred())
        PyErr_Clear(); /* never leaks into the program's code */
}

/* Run by the main thread between two bytecodes (see the top of the file). */
static int
pending_sample(void *arg)
{
    __atomic_store_n(&engine.pending, 0, __ATOMIC_RELEASE);
    uint64_t tick = __atomic_load_n(&engine.tick, __ATOMIC_ACQUIRE);
    if ((uint64_t)(uintptr_t)arg == engine.generation && engine.nsamplers > 0
        && __atomic_load_n(&engine.done, __ATOMIC_ACQUIRE) != tick) {
        /* the program's exception in flight, if any, is left untouched */
#if PY_VERSION_HEX >= 0x030C0000
        PyObject *exc = PyErr_GetRaisedException();
        sample_all();
        PyErr_SetRaisedException(exc);
#else
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        sample_all();
        PyErr_Restore(et, ev, tb);
#endif
        engine.pended++;
        __atomic_store_n(&engine.done, tick, __ATOMIC_RELEASE);
    }
    return 0;
}

/* How long a tick waits for the main thread before sampling itself. */
#define PENDING_WAIT_NS 200000

static void
sleep_ns(uint64_t ns)
{
    struct timespec ts = {(time_t)(ns / 1000000000u), (long)(ns % 1000000000u)};
    nanosleep(&ts, NULL);
}

static void
add_ns(struct timespec *ts, uint64_t ns)
{
    uint64_t t = (uint64_t)ts->tv_sec * 1000000000u + (uint64_t)ts->tv_nsec + ns;
    ts->tv_sec = (time_t)(t / 1000000000u);
    ts->tv_nsec = (long)(t % 1000000000u);
}

static void
engine_tick(uint64_t generation)
{
    uint64_t tick = __atomic_add_fetch(&engine.tick, 1, __ATOMIC_ACQ_REL);
    engine.ticks++;
    int pended = 0;
    if (!__atomic_exchange_n(&engine.pending, 1, __ATOMIC_ACQ_REL)) {
        if (Py_AddPendingCall(pending_sample, (void *)(uintptr_t)generation) == 0) {
            pended = 1;
#if PY_VERSION_HEX < 0x030D0000
            /* 3.11 and 3.12 raise the eval breaker for a pending call only
             * when the thread adding it could run it itself (the main
             * thread): from here the main thread would see the call at its
             * next GIL hand-off, up to a switch interval later. A signal
             * handler raises it for any thread (_PyEval_SignalReceived);
             * so does this, and the main thread runs the call at its next
             * check, then recomputes the breaker. (3.13 raises it.) */
            _Py_atomic_store_relaxed(&PyInterpreterState_Main()->ceval.eval_breaker, 1);
#endif
        }
        else {
            __atomic_store_n(&engine.pending, 0, __ATOMIC_RELEASE); /* queue full: sample here */
        }
    }
    else {
        pended = 1; /* the previous one is still queued: the main thread is busy elsewhere */
    }
    if (pended) {
        for (uint64_t waited = 0; waited < PENDING_WAIT_NS; waited += 25000) {
            if (__atomic_load_n(&engine.done, __ATOMIC_ACQUIRE) == tick)
                return;
            sleep_ns(25000);
        }
    }
    uint64_t asked = now_ns();
    PyEval_RestoreThread(engine.own_ts);
    engine.gil_wait_ns += now_ns() - asked;
    if (__atomic_load_n(&engine.done, __ATOMIC_ACQUIRE) != tick && engine.generation == generation) {
        sample_all();
        engine.direct++;
        __atomic_store_n(&engine.done, tick, __ATOMIC_RELEASE);
    }
    PyEval_SaveThread();
}

static void *
engine_main(void *arg)
{
    uint64_t generation = (uint64_t)(uintptr_t)arg;
    PyGILState_STATE g = PyGILState_Ensure();
    engine.own_ts = PyThreadState_Get();
    PyEval_SaveThread();
    struct timespec next;
    clock_gettime(CLOCK_MONOTONIC, &next);
    pthread_mutex_lock(&engine.mu);
    for (;;) {
        add_ns(&next, engine.interval);
        while (!engine.quit) {
            int r = pthread_cond_timedwait(&engine.cv, &engine.mu, &next);
            if (r == ETIMEDOUT)
                break;
        }
        if (engine.quit)
            break;
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec > next.tv_sec + 1)
            next = now; /* suspended, or far behind: start again from now */
        pthread_mutex_unlock(&engine.mu);
        engine_tick(generation);
        pthread_mutex_lock(&engine.mu);
    }
    pthread_mutex_unlock(&engine.mu);
    PyEval_RestoreThread(engine.own_ts);
    engine.own_ts = NULL;
    PyGILState_Release(g);
    return NULL;
}

static void
engine_set_interval(void)
{
    uint64_t iv = 0;
    for (int k = 0; k < engine.nsamplers; k++)
        if (iv == 0 || engine.samplers[k]->interval < iv)
            iv = engine.samplers[k]->interval;
    pthread_mutex_lock(&engine.mu);
    engine.interval = iv ? iv : 1000000;
    pthread_mutex_unlock(&engine.mu);
}

static int
engine_start_thread(void)
{
    engine.quit = 0;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 256 * 1024);
    int r = pthread_create(&engine.thread, &attr, engine_main, (void *)(uintptr_t)engine.generation);
    pthread_attr_destroy(&attr);
    if (r != 0) {
        errno = r;
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    engine.thread_running = 1;
    return 0;
}

static int engine_joining = 0; /* engine_remove() is joining the thread (GIL released) */

static int
engine_add(Sampler *s)
{
    Sampler **ns = PyMem_Realloc(engine.samplers, sizeof(Sampler *) * (size_t)(engine.nsamplers + 1));
    if (ns == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    engine.samplers = ns;
    engine.samplers[engine.nsamplers++] = (Sampler *)Py_NewRef((PyObject *)s);
    engine_set_interval();
    /* While another thread joins the stopping engine, it starts a new one
     * when it is done and finds samplers again. */
    if (!engine.thread_running && !engine_joining && engine_start_thread() < 0) {
        engine.nsamplers--;
        Py_DECREF(s);
        return -1;
    }
    return 0;
}

/* Remove s; the last one stops the engine thread (joined with the GIL
 * released: it may be waiting for it). */
static void
engine_remove(Sampler *s)
{
    for (int k = 0; k < engine.nsamplers; k++) {
        if (engine.samplers[k] != s)
            continue;
        memmove(&engine.samplers[k], &engine.samplers[k + 1], sizeof(Sampler *) * (size_t)(engine.nsamplers - k - 1));
        engine.nsamplers--;
        Py_DECREF(s);
        break;
    }
    if (engine.nsamplers > 0) {
        engine_set_interval();
        return;
    }
    if (!engine.thread_running || engine_joining)
        return;
    pthread_mutex_lock(&engine.mu);
    engine.quit = 1;
    pthread_cond_signal(&engine.cv);
    pthread_mutex_unlock(&engine.mu);
    pthread_t th = engine.thread;
    engine_joining = 1;
    Py_BEGIN_ALLOW_THREADS
    pthread_join(th, NULL);
    Py_END_ALLOW_THREADS
    engine_joining = 0;
    engine.thread_running = 0;
    if (engine.nsamplers > 0 && engine_start_thread() < 0) /* started meanwhile */
        PyErr_WriteUnraisable(NULL);
}

/* ------------------------------------------------------------------------ */
/* 4. The Sampler type                                                       */
/* ------------------------------------------------------------------------ */

static int
Sampler_init(Sampler *s, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"rf_state", "recorder",    "lt_var",      "ignore_prefix", "interval",
                             "waits",    "max_samples", "keep_latest", NULL};
    PyObject *rf_var, *recorder, *lt_var, *prefix, *waits;
    double interval;
    Py_ssize_t max_samples = 0;
    int keep_latest = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOUdO!|np", kwlist, &rf_var, &recorder, &lt_var, &prefix, &interval,
                                     &PyTuple_Type, &waits, &max_samples, &keep_latest))
        return -1;
    if (!PyContextVar_CheckExact(rf_var) || !PyContextVar_CheckExact(lt_var)) {
        PyErr_SetString(PyExc_TypeError, "Sampler: rf_state and lt_var must be ContextVars");
        return -1;
    }
    if (!(interval >= 1e-5 && interval <= 60.0)) {
        PyErr_SetString(PyExc_ValueError, "Sampler: interval must be between 10 microseconds and 60 seconds");
        return -1;
    }
    if (max_samples < 0) {
        PyErr_SetString(PyExc_ValueError, "Sampler: max_samples must be >= 0");
        return -1;
    }
    if (keep_latest && max_samples == 0) {
        PyErr_SetString(PyExc_ValueError, "Sampler: keep_latest needs max_samples > 0");
        return -1;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(waits); i++) {
        PyObject *w = PyTuple_GET_ITEM(waits, i);
        if (!PyTuple_Check(w) || PyTuple_GET_SIZE(w) != 2 || !PyUnicode_Check(PyTuple_GET_ITEM(w, 0))
            || !PyUnicode_Check(PyTuple_GET_ITEM(w, 1))) {
            PyErr_SetString(PyExc_TypeError, "Sampler: waits must be (file suffix, qualname) pairs of str");
            return -1;
        }
    }
    if (s->active) {
        PyErr_SetString(PyExc_RuntimeError, "Sampler: cannot re-initialise a running sampler");
        return -1;
    }
    Py_XSETREF(s->rf_var, Py_NewRef(rf_var));
    Py_XSETREF(s->recorder, Py_NewRef(recorder));
    Py_XSETREF(s->lt_var, Py_NewRef(lt_var));
    Py_XSETREF(s->prefix, Py_NewRef(prefix));
    Py_XSETREF(s->waits, Py_NewRef(waits));
    s->global = recorder == Py_None;
    s->interval = (uint64_t)(interval * 1e9);
    s->max_samples = max_samples;
    s->ring = keep_latest;
    if (s->objs == NULL && (s->objs = PyList_New(0)) == NULL)
        return -1;
    if (s->nnodes == 0) { /* node 0: the empty stack */
        s->nodes = PyMem_Calloc(1024 * 2, sizeof(uint32_t));
        if (s->nodes == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        s->nodes_cap = 1024;
        s->nnodes = 1;
    }
    return 0;
}

static void
s_release(Sampler *s)
{
    for (int i = 0; i < s->nthreads; i++)
        Py_CLEAR(s->threads[i].last_vars);
    PyMem_Free(s->threads);
    s->threads = NULL;
    s->nthreads = 0;
    PyMem_Free(s->table);
    s->table = NULL;
    s->table_size = s->table_used = 0;
    PyMem_Free(s->trie);
    s->trie = NULL;
    s->trie_size = s->trie_used = 0;
    Py_CLEAR(s->pos);
    Py_CLEAR(s->neg);
}

static int
Sampler_traverse(Sampler *s, visitproc visit, void *arg)
{
    Py_VISIT(s->rf_var);
    Py_VISIT(s->recorder);
    Py_VISIT(s->lt_var);
    Py_VISIT(s->waits);
    Py_VISIT(s->objs);
    Py_VISIT(s->pos);
    Py_VISIT(s->neg);
    for (int i = 0; i < s->nthreads; i++)
        Py_VISIT(s->threads[i].last_vars);
    return 0;
}

static int
Sampler_clear(Sampler *s)
{
    Py_CLEAR(s->rf_var);
    Py_CLEAR(s->recorder);
    Py_CLEAR(s->lt_var);
    Py_CLEAR(s->prefix);
    Py_CLEAR(s->waits);
    Py_CLEAR(s->objs);
    s_release(s);
    return 0;
}

static void
Sampler_dealloc(Sampler *s)
{
    PyObject_GC_UnTrack(s);
    Sampler_clear(s);
    PyMem_Free(s->buf);
    PyMem_Free(s->nodes);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

static PyObject *
Sampler_start(Sampler *s, PyObject *Py_UNUSED(ignored))
{
    if (s->objs == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Sampler: not initialised");
        return NULL;
    }
    if (s->active || s->start_ns) {
        PyErr_SetString(PyExc_RuntimeError, "Sampler.start: this sampler was already started");
        return NULL;
    }
    s->start_ns = s->last_ns = now_ns();
    s->next_ns = s->start_ns + s->interval;
    s->active = 1;
    if (engine_add(s) < 0) {
        s->active = 0;
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
Sampler_stop(Sampler *s, PyObject *Py_UNUSED(ignored))
{
    if (s->active) {
        s->active = 0;
        engine_remove(s);
    }
    Py_CLEAR(s->pos);
    Py_CLEAR(s->neg);
    Py_RETURN_NONE;
}

/* (samples oldest first, stack trie nodes, objects, thread idents by
 * slot): copies, and with `own` the object table itself (take hands it
 * over; peek copies it). */
static PyObject *
sampler_data(Sampler *s, int own)
{
    Py_ssize_t sample = 3 * (Py_ssize_t)sizeof(uint64_t);
    PyObject *data = PyBytes_FromStringAndSize(NULL, s->len * sample);
    if (data != NULL && s->len) { /* a ring's oldest sample is at head */
        char *out = PyBytes_AS_STRING(data);
        memcpy(out, (const char *)(s->buf + 3 * s->head), (size_t)((s->len - s->head) * sample));
        memcpy(out + (s->len - s->head) * sample, (const char *)s->buf, (size_t)(s->head * sample));
    }
    PyObject *nodes = PyBytes_FromStringAndSize((const char *)s->nodes, s->nnodes * 2 * (Py_ssize_t)sizeof(uint32_t));
    PyObject *idents = PyList_New(s->nthreads);
    PyObject *objs = NULL;
    if (data == NULL || nodes == NULL || idents == NULL)
        goto error;
    for (int i = 0; i < s->nthreads; i++) {
        PyObject *id = PyLong_FromUnsignedLong(s->threads[i].ident);
        if (id == NULL)
            goto error;
        PyList_SET_ITEM(idents, i, id);
    }
    if (own) {
        if ((objs = PyList_New(0)) == NULL)
            goto error;
        PyObject *held = s->objs;
        s->objs = objs;
        objs = held;
    }
    else if ((objs = PyList_GetSlice(s->objs, 0, PyList_GET_SIZE(s->objs))) == NULL)
        goto error;
    return Py_BuildValue("(NNNN)", data, nodes, objs, idents);
error:
    Py_XDECREF(data);
    Py_XDECREF(nodes);
    Py_XDECREF(idents);
    return NULL;
}

/* The samples so far, handed over once, after stop; the sampler keeps
 * none (see sampler_data). */
static PyObject *
Sampler_take(Sampler *s, PyObject *Py_UNUSED(ignored))
{
    if (s->active) {
        PyErr_SetString(PyExc_RuntimeError, "Sampler.take: stop the sampler first");
        return NULL;
    }
    PyObject *out = sampler_data(s, 1);
    if (out == NULL)
        return NULL;
    PyMem_Free(s->buf);
    s->buf = NULL;
    s->len = s->cap = s->head = 0;
    s->nnodes = 1;
    s_release(s);
    return out;
}

/* A copy of the samples so far, the sampler running on (a flight
 * recorder's dump). The samples are written with the GIL held, so the copy
 * is of whole samples. */
static PyObject *
Sampler_peek(Sampler *s, PyObject *Py_UNUSED(ignored))
{
    return sampler_data(s, 0);
}

static PyObject *
Sampler_get_count(Sampler *s, void *c)
{
    return PyLong_FromSsize_t(s->len);
}

static PyObject *
Sampler_get_dropped(Sampler *s, void *c)
{
    return PyLong_FromSsize_t(s->dropped);
}

static PyObject *
Sampler_get_idle(Sampler *s, void *c)
{
    return PyLong_FromSsize_t(s->idle);
}

static PyObject *
Sampler_get_active(Sampler *s, void *c)
{
    return PyBool_FromLong(s->active);
}

static PyObject *
Sampler_get_start_ns(Sampler *s, void *c)
{
    return PyLong_FromUnsignedLongLong(s->start_ns);
}

static PyMethodDef Sampler_methods[] = {
    {"start", (PyCFunction)Sampler_start, METH_NOARGS, "Start sampling (the engine thread starts with the first sampler)."},
    {"stop", (PyCFunction)Sampler_stop, METH_NOARGS, "Stop sampling (the engine thread stops with the last)."},
    {"take", (PyCFunction)Sampler_take, METH_NOARGS, "Hand over (samples, nodes, objs, thread idents)."},
    {"peek", (PyCFunction)Sampler_peek, METH_NOARGS, "A copy of (samples, nodes, objs, thread idents), running on."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Sampler_getset[] = {
    {"count", (getter)Sampler_get_count, NULL, "Samples kept.", NULL},
    {"dropped", (getter)Sampler_get_dropped, NULL, "Samples not kept (max_samples, no memory).", NULL},
    {"idle", (getter)Sampler_get_idle, NULL, "Samples of a loop waiting for I/O.", NULL},
    {"active", (getter)Sampler_get_active, NULL, "Whether the sampler samples.", NULL},
    {"start_ns", (getter)Sampler_get_start_ns, NULL, "When it started (perf_counter_ns).", NULL},
    {NULL},
};

static PyTypeObject SamplerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "aprof._ctracer.Sampler",
    .tp_basicsize = sizeof(Sampler),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Task-aware stack samples at an interval (see aprof/_ctracer.pyi).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Sampler_init,
    .tp_dealloc = (destructor)Sampler_dealloc,
    .tp_traverse = (traverseproc)Sampler_traverse,
    .tp_clear = (inquiry)Sampler_clear,
    .tp_methods = Sampler_methods,
    .tp_getset = Sampler_getset,
};

/* _sampler_after_fork(): in a forked child. The engine thread does not
 * exist there; its lock may have been held by it at the fork. The child's
 * samplers record nothing (a pending call queued before the fork is
 * ignored: the generation moved on). */
static PyObject *
sampler_after_fork(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    pthread_mutex_init(&engine.mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&engine.cv, &ca);
    pthread_condattr_destroy(&ca);
    engine.thread_running = 0;
    engine_joining = 0;
    engine.own_ts = NULL;
    engine.generation++;
    engine.pending = 0;
    for (int k = 0; k < engine.nsamplers; k++) {
        engine.samplers[k]->forked = 1;
        engine.samplers[k]->active = 0;
        Py_DECREF(engine.samplers[k]);
    }
    engine.nsamplers = 0;
    Py_RETURN_NONE;
}

/* _sampler_stats(): (ticks, sampled by the main thread, sampled by the
 * engine thread, ns spent taking samples, ns the engine waited for the
 * GIL), since the process started, for the bench. */
static PyObject *
sampler_stats(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    return Py_BuildValue("(KKKKK)", (unsigned long long)engine.ticks, (unsigned long long)engine.pended,
                         (unsigned long long)engine.direct, (unsigned long long)engine.sample_ns,
                         (unsigned long long)engine.gil_wait_ns);
}

/* ------------------------------------------------------------------------ */
/* A task's spawn site (aprof._frames.user_site, for TaskThread)              */
/* ------------------------------------------------------------------------ */

/* A suspended coroutine's code and offset, for the await chain's walk in
 * _ctasks.c (declared in _cext.h): read here, where CPython's frames are. */
int
aprof_gen_site(PyObject *gen, PyObject **code, int *lasti)
{
    PyGenObject *g = (PyGenObject *)gen;
    int8_t st = g->gi_frame_state;
#if PY_VERSION_HEX >= 0x030D0000
    if (st != FRAME_SUSPENDED && st != FRAME_SUSPENDED_YIELD_FROM)
        return 0;
#else
    if (st != FRAME_SUSPENDED)
        return 0;
#endif
    struct _PyInterpreterFrame *f = (struct _PyInterpreterFrame *)g->gi_iframe;
    PyCodeObject *co = frame_code(f);
    if (co == NULL)
        return 0;
    int l = _PyInterpreterFrame_LASTI(f);
    *code = (PyObject *)co;
    *lasti = l < 0 ? -1 : l * (int)sizeof(_Py_CODEUNIT); /* PyFrame_GetLasti */
    return 1;
}

/* A coroutine's or generator's code (borrowed), in any state: its frame
 * keeps its code until the generator is freed (what cr_code reads). */
PyObject *
aprof_gen_code(PyObject *gen)
{
    struct _PyInterpreterFrame *f = (struct _PyInterpreterFrame *)((PyGenObject *)gen)->gi_iframe;
#if PY_VERSION_HEX >= 0x030D0000
    PyObject *c = f->f_executable;
    return c != NULL && PyCode_Check(c) ? c : NULL;
#else
    return (PyObject *)f->f_code;
#endif
}

/* user_site(cache, is_library) -> (file, line, function) | None

   The nearest frame of the user's code, from the calling Python frame out:
   aprof._frames.user_site() without sys._getframe()'s audit event, the
   interpreted loop, or a frame object made for each frame it passes (it
   reads the interpreter's frames, as the sampler does). `cache` maps a file
   name to whether it is a library's; `is_library(filename)` decides (and
   caches) a name not in it. */
/* The sites found last, by (code, instruction): a spawn site repeats (a
 * loop of create_task), and its line costs a walk of the code's line
 * table. An entry holds its code, so no other code takes its address. */
#define SITE_CACHE_SIZE 256
static struct {
    PyCodeObject *code;
    int lasti;
    PyObject *site;
} site_cache[SITE_CACHE_SIZE];

/* The verdict per code, of the last codes seen: is_library(co_filename)
 * says the same for a file name for good, and a spawn walks the same
 * frames again and again. An entry holds its code. */
#define LIB_MEMO_SIZE 256
static struct {
    PyCodeObject *code;
    int is_lib;
} lib_memo[LIB_MEMO_SIZE];

PyObject *
aprof_user_site(PyObject *cache, PyObject *is_library)
{
    for (struct _PyInterpreterFrame *f = ts_frame(PyThreadState_Get()); f != NULL; f = f->previous) {
        PyCodeObject *code = frame_code(f);
        if (code == NULL)
            continue;
        PyObject *filename = code->co_filename;
        size_t m = ((uintptr_t)code >> 4) & (LIB_MEMO_SIZE - 1);
        int is_lib;
        if (lib_memo[m].code == code) {
            is_lib = lib_memo[m].is_lib;
            if (is_lib)
                continue;
            goto user;
        }
        PyObject *lib = PyDict_GetItemWithError(cache, filename); /* borrowed */
        if (lib != NULL) {
            is_lib = PyObject_IsTrue(lib);
        }
        else if (PyErr_Occurred()) {
            return NULL;
        }
        else {
            /* A call into Python: it may run frames of its own, but the
             * ones below it (ours to walk) stay as they are. */
            Py_INCREF(code);
            PyObject *r = PyObject_CallOneArg(is_library, filename);
            is_lib = r == NULL ? -1 : PyObject_IsTrue(r);
            Py_XDECREF(r);
            Py_DECREF(code);
        }
        if (is_lib < 0)
            return NULL;
        Py_INCREF(code);
        Py_XSETREF(lib_memo[m].code, code);
        lib_memo[m].is_lib = is_lib;
        if (!is_lib) {
        user:;
            int lasti = _PyInterpreterFrame_LASTI(f);
            size_t h = (((uintptr_t)code >> 4) ^ ((size_t)lasti * 2654435761u)) & (SITE_CACHE_SIZE - 1);
            if (site_cache[h].code == code && site_cache[h].lasti == lasti)
                return Py_NewRef(site_cache[h].site);
            int line = PyCode_Addr2Line(code, lasti * (int)sizeof(_Py_CODEUNIT));
            PyObject *site = Py_BuildValue("(OiO)", filename, line < 0 ? 0 : line, code->co_qualname);
            if (site == NULL)
                return NULL;
            Py_XSETREF(site_cache[h].site, Py_NewRef(site));
            Py_INCREF(code);
            Py_XSETREF(site_cache[h].code, code);
            site_cache[h].lasti = lasti;
            return site;
        }
    }
    Py_RETURN_NONE;
}

static PyObject *
user_site(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyDict_CheckExact(args[0])) {
        PyErr_SetString(PyExc_TypeError, "user_site(cache: dict, is_library)");
        return NULL;
    }
    return aprof_user_site(args[0], args[1]);
}

int
aprof_is_user_site(PyObject *fn)
{
    return PyCFunction_Check(fn) && PyCFunction_GET_FUNCTION(fn) == (PyCFunction)(void (*)(void))user_site;
}

static PyMethodDef sampler_functions[] = {
    {"_sampler_after_fork", sampler_after_fork, METH_NOARGS, "Reset the sampler engine in a forked child."},
    {"user_site", (PyCFunction)(void (*)(void))user_site, METH_FASTCALL,
     "The nearest user frame from the caller out: (file, line, function), or None."},
    {"_sampler_stats", sampler_stats, METH_NOARGS,
     "(ticks, sampled by the main thread, by the engine, ns sampling, ns waiting for the GIL)."},
    {NULL, NULL, 0, NULL},
};

int
aprof_sampler_init(PyObject *module)
{
    if (PyType_Ready(&SamplerType) < 0)
        return -1;
    str_get = PyUnicode_InternFromString("get");
    str_recorder_s = PyUnicode_InternFromString("recorder");
    str_enabled_s = PyUnicode_InternFromString("enabled");
    str_threading_py = PyUnicode_InternFromString("threading.py");
    if (str_get == NULL || str_recorder_s == NULL || str_enabled_s == NULL || str_threading_py == NULL)
        return -1;
    pthread_mutex_init(&engine.mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&engine.cv, &ca);
    pthread_condattr_destroy(&ca);
    engine.interval = 1000000;
    engine.generation = 1;
    if (PyModule_AddObjectRef(module, "Sampler", (PyObject *)&SamplerType) < 0)
        return -1;
    return PyModule_AddFunctions(module, sampler_functions);
}
