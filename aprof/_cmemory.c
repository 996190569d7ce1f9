/*
 * profile(profile_memory=True): allocation tracking (issue 21).
 *
 * Stacks aprof's hooks on CPython's MEM and OBJ allocator domains
 * (PyMem_GetAllocator / PyMem_SetAllocator), wrapping whatever was installed
 * (the default allocators, tracemalloc's hooks, a debug allocator). Both
 * domains are called with the GIL held, so the state below needs no lock.
 * The RAW domain (called without the GIL, by C code outside Python objects)
 * is left alone.
 *
 * Sampling. A byte countdown is decremented by every allocation's size;
 * an allocation that takes it to zero or below is sampled, and the countdown
 * is redrawn from an exponential distribution of mean `interval` bytes (a
 * Poisson process over bytes, as tcmalloc and heapprofd sample). An
 * allocation of s bytes is then sampled with probability 1 - exp(-s/R), so
 * weighting it s / (1 - exp(-s/R)) makes every sum unbiased. With
 * interval 0 every allocation is recorded with its own size (exact mode).
 * The hot path of an allocation not sampled is one subtraction and one
 * compare; of a free, one probe of the table of live sampled blocks.
 *
 * A sampled allocation records (time, size, weight, logical thread, free
 * time). Its logical thread is read from the running context, as the
 * tracer and the sampler read it (aprof/_core/_tracer.py): RF_STATE says
 * whether the work is this profile's (context scope) and whether recording
 * is on; TRACER_LT names the task. Both answers are cached under the
 * identity of the context's variables (an immutable HAMT). An allocation
 * in work the profile does not record is only added to the "other" totals.
 * A sampled block's address goes into an open-addressing table; its free
 * (or its move by realloc) writes the free time into its record.
 *
 * Nothing here runs Python code or drops a reference: a reference dropped
 * inside an allocator could free an object whose finalizer runs Python
 * inside malloc. References the cache replaces are dropped by a pending
 * call (Py_AddPendingCall), between two bytecodes of the main thread.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "_cext.h"

#if PY_VERSION_HEX >= 0x030E0000
#error "aprof's memory hooks read the CPython 3.11-3.13 context layout"
#endif

/* The head of CPython's struct _pycontextobject (see _ctracer.c). */
typedef struct {
    PyObject_HEAD
    PyObject *ctx_prev;
    PyObject *ctx_vars;
} MContextHead;

/* The lt field of a record: a logical thread id, or OWN_THREAD | the index
 * of an OS thread in `idents` (the thread's own logical thread, resolved at
 * stop). */
#define OWN_THREAD ((uint64_t)1 << 63)

typedef struct {
    uint64_t t;      /* perf_counter_ns at the allocation */
    uint64_t size;   /* bytes asked for */
    uint64_t weight; /* bytes it stands for (size in exact mode) */
    uint64_t lt;     /* see OWN_THREAD */
    uint64_t freed;  /* perf_counter_ns at its free, 0 while live */
} MemRec;

static struct {
    int installed;      /* our hooks are in the allocator chain */
    int recording;
    int busy;           /* inside on_sample: our own allocations pass */
    PyMemAllocatorEx orig_mem, orig_obj;
    PyMemAllocatorEx hook_mem, hook_obj;
    PyObject *rf_var, *recorder, *lt_var; /* strong */
    int global;
    uint64_t interval;  /* bytes, 0: every allocation */
    int64_t countdown;
    uint64_t rng;
    /* records: with `latest`, a ring of `max` slots: record number k (the
     * k-th sampled, counted in n) is in slot k % max, and `ptrs` holds each
     * slot's block, so a record let go also leaves the live table */
    MemRec *recs;
    uintptr_t *ptrs;
    size_t n, cap, max;
    int latest;
    uint64_t dropped;
    /* live sampled blocks: address -> record index + 1 (0: empty) */
    uintptr_t *keys;
    uint64_t *vals;
    size_t mask, used;
    /* the OS threads seen outside any task */
    unsigned long *idents;
    size_t nidents;
    /* logical thread objects seen: {id: LogicalThread} */
    PyObject *lts;
    /* the context cache */
    PyObject *last_vars;
    unsigned long last_ident;
    int last_in;
    uint64_t last_lt;
    PyObject *pos, *neg;
    /* the last stepping task seen and its id */
    PyObject *step_obj;
    uint64_t step_id;
    /* references replaced while recording, dropped at a safe point */
    PyObject **grave;
    size_t ngrave, capgrave;
    int drain_pending;
    /* allocations of work not profiled (weighted bytes, count) */
    uint64_t other_bytes, other_count;
} M;

static PyObject *str_enabled_m, *str_recorder_m, *str_id_m;

/* ------------------------------------------------------------------------ */
/* Helpers (raw C heap only: never the hooked domains)                       */
/* ------------------------------------------------------------------------ */

static int grave_drain(void *unused);

static void
grave_push(PyObject *o)
{
    if (o == NULL)
        return;
    if (!M.drain_pending && M.recording) {
        /* Dropped at the next safe point (between two bytecodes of the main
         * thread), not at stop: a context's variables (the program's values)
         * are not kept alive for the whole profile. */
        if (Py_AddPendingCall(grave_drain, NULL) == 0)
            M.drain_pending = 1;
    }
    if (M.ngrave == M.capgrave) {
        size_t cap = M.capgrave ? M.capgrave * 2 : 64;
        PyObject **g = realloc(M.grave, cap * sizeof *g);
        if (g == NULL)
            return; /* leaked rather than dropped here */
        M.grave = g;
        M.capgrave = cap;
    }
    M.grave[M.ngrave++] = o;
}

/* A pending call: drop the references the hooks replaced (never inside an
 * allocator: a finalizer could run there). */
static int
grave_drain(void *Py_UNUSED(unused))
{
    M.drain_pending = 0;
    if (M.busy)
        return 0;
    PyObject **g = M.grave;
    size_t n = M.ngrave;
    M.grave = NULL;
    M.ngrave = M.capgrave = 0;
    for (size_t i = 0; i < n; i++)
        Py_DECREF(g[i]);
    free(g);
    return 0;
}

static uint64_t
next_rand(void)
{
    /* xorshift64* */
    uint64_t x = M.rng;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    M.rng = x;
    return x * 0x2545F4914F6CDD1Dull;
}

static int64_t
draw_countdown(void)
{
    if (M.interval == 0)
        return 0;
    /* u in (0, 1] */
    double u = ((double)(next_rand() >> 11) + 1.0) / 9007199254740992.0;
    double v = -log(u) * (double)M.interval;
    if (v < 1.0)
        v = 1.0;
    if (v > 9.0e18)
        v = 9.0e18;
    return (int64_t)v;
}

static int
live_grow(void)
{
    size_t size = M.mask ? (M.mask + 1) * 2 : 1024;
    uintptr_t *keys = calloc(size, sizeof *keys);
    uint64_t *vals = calloc(size, sizeof *vals);
    if (keys == NULL || vals == NULL) {
        free(keys);
        free(vals);
        return -1;
    }
    size_t mask = size - 1;
    if (M.mask) {
        for (size_t i = 0; i <= M.mask; i++) {
            if (M.keys[i] == 0)
                continue;
            size_t j = hash_ptr((void *)M.keys[i], mask);
            while (keys[j] != 0)
                j = (j + 1) & mask;
            keys[j] = M.keys[i];
            vals[j] = M.vals[i];
        }
    }
    free(M.keys);
    free(M.vals);
    M.keys = keys;
    M.vals = vals;
    M.mask = mask;
    return 0;
}

static void
live_add(void *p, uint64_t rec)
{
    if ((M.used + 1) * 2 > M.mask + 1 && live_grow() < 0)
        return; /* its free will not be seen: counted live at stop */
    size_t j = hash_ptr(p, M.mask);
    while (M.keys[j] != 0 && M.keys[j] != (uintptr_t)p)
        j = (j + 1) & M.mask;
    if (M.keys[j] == 0)
        M.used++;
    M.keys[j] = (uintptr_t)p;
    M.vals[j] = rec + 1;
}

/* A block is freed (or moved): if it was sampled, its record gets the free
 * time and it leaves the table (backward-shift deletion: no tombstones). */
/* The slot of record number `rec`, or -1 if it is not kept (any more). */
static APROF_INLINE Py_ssize_t
rec_slot(uint64_t rec)
{
    if (rec >= M.n)
        return -1;
    if (!M.latest)
        return (Py_ssize_t)rec;
    if (rec + M.max < M.n)
        return -1; /* let go by the ring */
    return (Py_ssize_t)(rec % M.max);
}

static void live_delete_at(size_t j);

static APROF_NOINLINE void
live_forget_slow(void *p)
{
    size_t mask = M.mask;
    size_t j = hash_ptr(p, mask);
    while (M.keys[j] != (uintptr_t)p) {
        if (M.keys[j] == 0)
            return;
        j = (j + 1) & mask;
    }
    Py_ssize_t slot = rec_slot(M.vals[j] - 1);
    if (slot >= 0)
        M.recs[slot].freed = now_ns();
    live_delete_at(j);
}

/* The ring lets record `rec` of block `p` go: the block leaves the live
 * table (unless the address now belongs to a newer record), so the table
 * holds only blocks of kept records and stays bounded by the ring. */
static void
live_evict(uintptr_t p, uint64_t rec)
{
    if (M.used == 0 || p == 0)
        return;
    size_t mask = M.mask;
    size_t j = hash_ptr((void *)p, mask);
    while (M.keys[j] != p) {
        if (M.keys[j] == 0)
            return;
        j = (j + 1) & mask;
    }
    if (M.vals[j] == rec + 1)
        live_delete_at(j);
}

static void
live_delete_at(size_t j)
{
    size_t mask = M.mask;
    M.used--;
    size_t hole = j;
    for (;;) {
        j = (j + 1) & mask;
        if (M.keys[j] == 0)
            break;
        size_t home = hash_ptr((void *)M.keys[j], mask);
        /* can the entry at j move back into the hole? */
        if (((j - home) & mask) >= ((j - hole) & mask)) {
            M.keys[hole] = M.keys[j];
            M.vals[hole] = M.vals[j];
            hole = j;
        }
    }
    M.keys[hole] = 0;
    M.vals[hole] = 0;
}

static APROF_INLINE void
live_forget(void *p)
{
    if (M.used == 0 || p == NULL)
        return;
    size_t j = hash_ptr(p, M.mask);
    if (M.keys[j] == 0)
        return;
    live_forget_slow(p);
}

/* ------------------------------------------------------------------------ */
/* Which work is allocating                                                   */
/* ------------------------------------------------------------------------ */

static int
m_classify(PyObject *state)
{
    int ok = 0;
    PyObject *en = PyObject_GetAttr(state, str_enabled_m);
    if (en != NULL) {
        ok = en == Py_True;
        Py_DECREF(en); /* a bool: never freed */
    }
    if (ok && !M.global) {
        PyObject *rec = PyObject_GetAttr(state, str_recorder_m);
        ok = rec != NULL && rec == M.recorder;
        Py_XDECREF(rec); /* still held by the state */
    }
    PyErr_Clear();
    PyObject **slot = ok ? &M.pos : &M.neg;
    Py_INCREF(state);
    grave_push(*slot);
    *slot = state;
    return ok;
}

static uint64_t
own_thread(unsigned long ident)
{
    for (size_t i = 0; i < M.nidents; i++)
        if (M.idents[i] == ident)
            return OWN_THREAD | i;
    unsigned long *ni = realloc(M.idents, (M.nidents + 1) * sizeof *ni);
    if (ni == NULL)
        return OWN_THREAD | 0xFFFFFFFFu;
    M.idents = ni;
    M.idents[M.nidents] = ident;
    return OWN_THREAD | M.nidents++;
}

/* The logical thread of the running context: the task published in
 * TRACER_LT (if it runs on this OS thread), else the thread's own. */
static uint64_t
m_context_lt(unsigned long ident)
{
    PyObject *v = NULL;
    uint64_t lt = 0;
    if (PyContextVar_Get(M.lt_var, NULL, &v) < 0) {
        PyErr_Clear();
        v = NULL;
    }
    if (v != NULL && PyTuple_Check(v) && PyTuple_GET_SIZE(v) == 2) {
        unsigned long id2 = PyLong_AsUnsignedLong(PyTuple_GET_ITEM(v, 1));
        if (id2 == (unsigned long)-1 && PyErr_Occurred())
            PyErr_Clear();
        else if (id2 == ident) {
            PyObject *obj = PyTuple_GET_ITEM(v, 0);
            PyObject *id = PyObject_GetAttr(obj, str_id_m);
            if (id != NULL && PyLong_Check(id)) {
                long long x = PyLong_AsLongLong(id);
                if (x > 0 && PyDict_SetItem(M.lts, id, obj) == 0)
                    lt = (uint64_t)x;
            }
            /* the id is held by the LogicalThread (and now the dict) */
            Py_XDECREF(id);
            PyErr_Clear();
        }
    }
    Py_XDECREF(v); /* held by the context */
    return lt != 0 ? lt : own_thread(ident);
}

/* The id of the task stepping on this thread (aprof's task hooks publish
 * it in the stepping slot around each step of a task they record, see
 * aprof/_cranges.c), or 0. Cheaper than the task publishing itself in its
 * context (a ContextVar.set per task), and right for sibling tasks that
 * share their context's variables. Called with any exception saved. */
static uint64_t
stepping_id(PyThreadState *ts)
{
    PyObject *s = aprof_stepping_lt;
    if (s == NULL || (aprof_stepping_ctx != NULL && aprof_stepping_ctx != ts->context))
        return 0;
    if (s == M.step_obj)
        return M.step_id;
    uint64_t x = 0;
    PyObject *id = PyObject_GetAttr(s, str_id_m);
    if (id != NULL && PyLong_Check(id)) {
        long long v = PyLong_AsLongLong(id);
        if (v > 0 && PyDict_SetItem(M.lts, id, s) == 0)
            x = (uint64_t)v;
    }
    Py_XDECREF(id); /* held by the task's logical thread */
    PyErr_Clear();
    if (x != 0) {
        Py_INCREF(s);
        grave_push(M.step_obj);
        M.step_obj = s;
        M.step_id = x;
    }
    return x;
}

static APROF_NOINLINE void
on_sample(void *p, size_t size)
{
    M.countdown = draw_countdown();
    if (!M.recording || M.busy)
        return;
    M.busy = 1;
    uint64_t weight = size;
    if (M.interval != 0) {
        double r = (double)size / (double)M.interval;
        double prob = -expm1(-r);
        weight = prob > 0 ? (uint64_t)llround((double)size / prob) : M.interval;
    }
#if PY_VERSION_HEX >= 0x030D0000
    PyThreadState *ts = PyThreadState_GetUnchecked();
#else
    PyThreadState *ts = _PyThreadState_UncheckedGet();
#endif
    int in;
    uint64_t lt = 0;
    if (ts == NULL) {
        in = 0;
    }
    else {
        PyObject *ctx = ts->context;
        PyObject *vars = ctx != NULL ? ((MContextHead *)ctx)->ctx_vars : NULL;
        if (vars != NULL && vars == M.last_vars && ts->thread_id == M.last_ident) {
            in = M.last_in;
            lt = M.last_lt;
        }
        else if (ctx == NULL) {
            /* no context yet: no RF_STATE, no task */
            in = M.global;
            lt = in ? own_thread(ts->thread_id) : 0;
        }
        else {
#if PY_VERSION_HEX >= 0x030C0000
            PyObject *exc = PyErr_GetRaisedException();
#else
            PyObject *et, *ev, *tb;
            PyErr_Fetch(&et, &ev, &tb);
#endif
            PyObject *state = NULL;
            if (PyContextVar_Get(M.rf_var, NULL, &state) < 0) {
                PyErr_Clear();
                state = NULL;
            }
            if (state == NULL)
                in = M.global;
            else if (state == M.pos)
                in = 1;
            else if (state == M.neg)
                in = 0;
            else
                in = m_classify(state);
            Py_XDECREF(state); /* held by the context */
            if (in)
                lt = m_context_lt(ts->thread_id);
#if PY_VERSION_HEX >= 0x030C0000
            PyErr_SetRaisedException(exc);
#else
            PyErr_Restore(et, ev, tb);
#endif
            Py_XINCREF(vars);
            grave_push(M.last_vars);
            M.last_vars = vars;
            M.last_ident = ts->thread_id;
            M.last_in = in;
            M.last_lt = lt;
        }
    }
    if (in && ts != NULL && aprof_stepping_lt != NULL) {
#if PY_VERSION_HEX >= 0x030C0000
        PyObject *exc2 = PyErr_GetRaisedException();
#else
        PyObject *et2, *ev2, *tb2;
        PyErr_Fetch(&et2, &ev2, &tb2);
#endif
        uint64_t sid = stepping_id(ts);
        if (sid != 0)
            lt = sid;
#if PY_VERSION_HEX >= 0x030C0000
        PyErr_SetRaisedException(exc2);
#else
        PyErr_Restore(et2, ev2, tb2);
#endif
    }
    if (!in) {
        M.other_bytes += weight;
        M.other_count++;
        M.busy = 0;
        return;
    }
    if (M.max && M.n >= M.max && !M.latest) {
        M.dropped++; /* keep="first": the budget is full */
        M.busy = 0;
        return;
    }
    if (M.n == M.cap && (!M.latest || M.cap < M.max)) {
        size_t cap = M.cap ? M.cap * 2 : 4096;
        if (M.max && cap > M.max)
            cap = M.max;
        MemRec *nr = realloc(M.recs, cap * sizeof *nr);
        if (nr != NULL)
            M.recs = nr;
        if (nr != NULL && M.latest) {
            uintptr_t *np = realloc(M.ptrs, cap * sizeof *np);
            if (np == NULL)
                nr = NULL;
            else
                M.ptrs = np;
        }
        if (nr == NULL) {
            M.dropped++;
            M.busy = 0;
            return;
        }
        M.cap = cap;
    }
    size_t slot = M.n;
    if (M.latest) {
        slot = M.n % M.max;
        if (M.n >= M.max) {
            /* keep="latest": the oldest record gives its slot to this one */
            live_evict(M.ptrs[slot], M.n - M.max);
            M.dropped++;
        }
        M.ptrs[slot] = (uintptr_t)p;
    }
    MemRec *r = &M.recs[slot];
    r->t = now_ns();
    r->size = size;
    r->weight = weight;
    r->lt = lt;
    r->freed = 0;
    live_add(p, M.n);
    M.n++;
    M.busy = 0;
}

/* ------------------------------------------------------------------------ */
/* The hooks                                                                  */
/* ------------------------------------------------------------------------ */

static void *
m_malloc(void *ctx, size_t size)
{
    PyMemAllocatorEx *a = (PyMemAllocatorEx *)ctx;
    void *p = a->malloc(a->ctx, size);
    if (p != NULL && APROF_UNLIKELY((M.countdown -= (int64_t)size) <= 0))
        on_sample(p, size);
    return p;
}

static void *
m_calloc(void *ctx, size_t nelem, size_t elsize)
{
    PyMemAllocatorEx *a = (PyMemAllocatorEx *)ctx;
    void *p = a->calloc(a->ctx, nelem, elsize);
    size_t size = nelem * elsize;
    if (p != NULL && APROF_UNLIKELY((M.countdown -= (int64_t)size) <= 0))
        on_sample(p, size);
    return p;
}

static void *
m_realloc(void *ctx, void *ptr, size_t size)
{
    PyMemAllocatorEx *a = (PyMemAllocatorEx *)ctx;
    void *p = a->realloc(a->ctx, ptr, size);
    if (p != NULL) {
        /* a move (or resize) is the old block's free and a new block */
        live_forget(ptr);
        if (APROF_UNLIKELY((M.countdown -= (int64_t)size) <= 0))
            on_sample(p, size);
    }
    return p;
}

static void
m_free(void *ctx, void *ptr)
{
    PyMemAllocatorEx *a = (PyMemAllocatorEx *)ctx;
    live_forget(ptr);
    a->free(a->ctx, ptr);
}

static int
is_ours(PyMemAllocatorDomain d)
{
    PyMemAllocatorEx cur;
    PyMem_GetAllocator(d, &cur);
    return cur.malloc == m_malloc;
}

static void
m_clear_records(void)
{
    free(M.recs);
    M.recs = NULL;
    free(M.ptrs);
    M.ptrs = NULL;
    M.n = M.cap = 0;
    free(M.keys);
    free(M.vals);
    M.keys = NULL;
    M.vals = NULL;
    M.mask = M.used = 0;
    free(M.idents);
    M.idents = NULL;
    M.nidents = 0;
}

/* ------------------------------------------------------------------------ */
/* Module functions                                                           */
/* ------------------------------------------------------------------------ */

/* _memory_start(rf_var, recorder or None, lt_var, interval, max_records, seed, latest) */
static PyObject *
memory_start(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *rf_var, *recorder, *lt_var;
    unsigned long long interval, max_records, seed;
    int latest = 0;
    if (!PyArg_ParseTuple(args, "OOOKKK|p:_memory_start", &rf_var, &recorder, &lt_var, &interval, &max_records, &seed,
                          &latest))
        return NULL;
    if (M.recording) {
        PyErr_SetString(PyExc_RuntimeError,
                        "profile.start: another profile is tracking memory (profile_memory=True); "
                        "one at a time: the allocator hooks are process-wide");
        return NULL;
    }
    if (M.installed && !(is_ours(PYMEM_DOMAIN_MEM) && is_ours(PYMEM_DOMAIN_OBJ))) {
        PyErr_SetString(PyExc_RuntimeError,
                        "profile.start: profile_memory cannot hook the allocator: a hook installed on top of "
                        "aprof's by an earlier memory profile (tracemalloc.start() while it ran?) is still there; "
                        "stop it (tracemalloc.stop()) first");
        return NULL;
    }
    PyObject *lts = PyDict_New();
    if (lts == NULL)
        return NULL;
    m_clear_records();
    Py_INCREF(rf_var);
    Py_INCREF(lt_var);
    Py_INCREF(recorder);
    M.rf_var = rf_var;
    M.lt_var = lt_var;
    M.recorder = recorder;
    M.global = recorder == Py_None;
    M.lts = lts;
    M.interval = interval;
    M.max = (size_t)max_records;
    M.latest = latest && max_records > 0;
    M.dropped = 0;
    M.other_bytes = M.other_count = 0;
    M.rng = seed ? seed : (now_ns() | 1);
    M.countdown = draw_countdown();
    M.last_vars = M.pos = M.neg = NULL;
    M.last_ident = 0;
    M.step_obj = NULL;
    M.step_id = 0;
    if (!M.installed) {
        PyMem_GetAllocator(PYMEM_DOMAIN_MEM, &M.orig_mem);
        PyMem_GetAllocator(PYMEM_DOMAIN_OBJ, &M.orig_obj);
        M.hook_mem = (PyMemAllocatorEx){&M.orig_mem, m_malloc, m_calloc, m_realloc, m_free};
        M.hook_obj = (PyMemAllocatorEx){&M.orig_obj, m_malloc, m_calloc, m_realloc, m_free};
        PyMem_SetAllocator(PYMEM_DOMAIN_MEM, &M.hook_mem);
        PyMem_SetAllocator(PYMEM_DOMAIN_OBJ, &M.hook_obj);
        M.installed = 1;
    }
    M.recording = 1;
    Py_RETURN_NONE;
}

/* The records, oldest first (a ring that went round starts at the next
 * slot to be overwritten), as bytes; NULL on error. */
static PyObject *
records_bytes(void)
{
    size_t kept = M.latest && M.n > M.max ? M.max : M.n;
    size_t head = M.latest && M.n > M.max ? M.n % M.max : 0;
    PyObject *recs = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(kept * sizeof(MemRec)));
    if (recs != NULL && kept) {
        char *out = PyBytes_AS_STRING(recs);
        memcpy(out, M.recs + head, (kept - head) * sizeof(MemRec));
        memcpy(out + (kept - head) * sizeof(MemRec), M.recs, head * sizeof(MemRec));
    }
    return recs;
}

/* The OS threads seen outside any task, as a list of idents; NULL on error. */
static PyObject *
idents_list(void)
{
    PyObject *idents = PyList_New((Py_ssize_t)M.nidents);
    if (idents == NULL)
        return NULL;
    for (size_t i = 0; i < M.nidents; i++) {
        PyObject *x = PyLong_FromUnsignedLong(M.idents[i]);
        if (x == NULL) {
            Py_DECREF(idents);
            return NULL;
        }
        PyList_SET_ITEM(idents, (Py_ssize_t)i, x);
    }
    return idents;
}

int
aprof_memory_quiet(int quiet)
{
    int was = M.busy;
    M.busy = quiet;
    return was;
}

/* _memory_peek() -> what _memory_stop() would return, recording on (a
 * flight recorder's dump): copies, made with the hooks' own allocations
 * passing unrecorded (busy), so the records copied are those of before the
 * call. Frees are still watched meanwhile. */
static PyObject *
memory_peek(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(ignored))
{
    if (!M.recording) {
        PyErr_SetString(PyExc_RuntimeError, "_memory_peek: no memory profile is running");
        return NULL;
    }
    /* No collection inside (3.11 collects at an allocation): its
     * finalizers would run the program's code while the hooks pass. */
    int gc_was = PyGC_Disable();
    int was_busy = M.busy;
    M.busy = 1;
    PyObject *recs = records_bytes();
    PyObject *idents = recs != NULL ? idents_list() : NULL;
    PyObject *lts = idents == NULL ? NULL : M.lts != NULL ? PyDict_Copy(M.lts) : PyDict_New();
    M.busy = was_busy;
    if (gc_was)
        PyGC_Enable();
    if (lts == NULL) {
        Py_XDECREF(recs);
        Py_XDECREF(idents);
        return NULL;
    }
    return Py_BuildValue("(NNNKKK)", recs, idents, lts, (unsigned long long)M.other_bytes,
                         (unsigned long long)M.other_count, (unsigned long long)M.dropped);
}

/* _memory_stop() -> (records bytes, thread idents, {id: LogicalThread},
 * other_bytes, other_count, dropped). Restores the allocators when aprof's
 * hooks are still on top; otherwise they stay underneath, passing through. */
static PyObject *
memory_stop(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(ignored))
{
    if (!M.recording) {
        PyErr_SetString(PyExc_RuntimeError, "_memory_stop: no memory profile is running");
        return NULL;
    }
    M.recording = 0;
    M.interval = (uint64_t)1 << 62; /* left installed: pass through cheaply */
    M.countdown = INT64_MAX;
    if (M.installed && is_ours(PYMEM_DOMAIN_MEM) && is_ours(PYMEM_DOMAIN_OBJ)) {
        PyMem_SetAllocator(PYMEM_DOMAIN_MEM, &M.orig_mem);
        PyMem_SetAllocator(PYMEM_DOMAIN_OBJ, &M.orig_obj);
        M.installed = 0;
    }
    /* Live blocks are no longer watched: their records stay live. */
    free(M.keys);
    free(M.vals);
    M.keys = NULL;
    M.vals = NULL;
    M.mask = M.used = 0;
    PyObject *recs = records_bytes();
    PyObject *idents = idents_list();
    PyObject *lts = M.lts;
    M.lts = NULL;
    m_clear_records();
    /* drop what the hooks held, now that no hook can run inside this */
    PyObject **grave = M.grave;
    size_t ngrave = M.ngrave;
    M.grave = NULL;
    M.ngrave = M.capgrave = 0;
    grave_push(M.last_vars);
    grave_push(M.pos);
    grave_push(M.neg);
    grave_push(M.step_obj);
    M.last_vars = M.pos = M.neg = M.step_obj = NULL;
    PyObject **g2 = M.grave;
    size_t n2 = M.ngrave;
    M.grave = NULL;
    M.ngrave = M.capgrave = 0;
    for (size_t i = 0; i < ngrave; i++)
        Py_DECREF(grave[i]);
    for (size_t i = 0; i < n2; i++)
        Py_DECREF(g2[i]);
    free(grave);
    free(g2);
    Py_CLEAR(M.rf_var);
    Py_CLEAR(M.lt_var);
    Py_CLEAR(M.recorder);
    if (recs == NULL || idents == NULL || lts == NULL) {
        Py_XDECREF(recs);
        Py_XDECREF(idents);
        Py_XDECREF(lts);
        return NULL;
    }
    return Py_BuildValue("(NNNKKK)", recs, idents, lts, (unsigned long long)M.other_bytes,
                         (unsigned long long)M.other_count, (unsigned long long)M.dropped);
}

/* _memory_hooked() -> (installed, on top of both domains): for tests and
 * the docs' claim that stop restores the allocator. */
static PyObject *
memory_hooked(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(ignored))
{
    return Py_BuildValue("(ii)", M.installed, M.installed && is_ours(PYMEM_DOMAIN_MEM) && is_ours(PYMEM_DOMAIN_OBJ));
}

/* ------------------------------------------------------------------------ */
/* Charging allocations to ranges (aprof/_post/_memory.py: _charge)           */
/* ------------------------------------------------------------------------ */

typedef struct {
    int64_t tid, start, negend;
    int32_t row;
} ChargeRow;

typedef struct {
    int64_t tid, time;
    Py_ssize_t i;
} ChargeAlloc;

static int
cmp_charge_row(const void *a, const void *b)
{
    const ChargeRow *x = a, *y = b;
    if (x->tid != y->tid)
        return x->tid < y->tid ? -1 : 1;
    if (x->start != y->start)
        return x->start < y->start ? -1 : 1;
    if (x->negend != y->negend)
        return x->negend < y->negend ? -1 : 1;
    return (x->row > y->row) - (x->row < y->row);
}

static int
cmp_charge_alloc(const void *a, const void *b)
{
    const ChargeAlloc *x = a, *y = b;
    if (x->tid != y->tid)
        return x->tid < y->tid ? -1 : 1;
    if (x->time != y->time)
        return x->time < y->time ? -1 : 1;
    return (x->i > y->i) - (x->i < y->i);
}

static int
cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* A read-only buffer of n items of `width` bytes, or -1 with an error set. */
static Py_ssize_t
charge_column(PyObject *obj, Py_buffer *view, Py_ssize_t width, const char *what)
{
    if (PyObject_GetBuffer(obj, view, PyBUF_SIMPLE) < 0)
        return -1;
    if (view->len % width != 0) {
        PyErr_Format(PyExc_ValueError, "charge_allocations: %s is not a column of %zd-byte items", what, width);
        PyBuffer_Release(view);
        return -1;
    }
    return view->len / width;
}

/* charge_allocations(track, kind, start, end, track_ids, skip, alloc_tid,
 * alloc_time) -> bytes of int32: for each allocation, the row of the
 * innermost range open on its track (track_ids[track[row]] == its tid) at
 * its time, -1 if none; rows whose kind has a `skip` bit are not ranges.
 * The same answer as _memory._charge's loop (ties broken the same way:
 * rows by start, the longer first, then by row; allocations by time, then
 * by order), in C: a session of millions of events is charged in one sort
 * of the rows of the tracks that allocated, not a Python loop over them. */
static PyObject *
charge_allocations(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "charge_allocations takes 8 arguments");
        return NULL;
    }
    long skip = PyLong_AsLong(args[5]);
    if (skip == -1 && PyErr_Occurred())
        return NULL;
    Py_buffer v[7];
    static const Py_ssize_t widths[7] = {4, 1, 8, 8, 8, 8, 8};
    static const char *names[7] = {"track", "kind", "start", "end", "track_ids", "alloc_tid", "alloc_time"};
    Py_ssize_t len[7];
    int got = 0;
    PyObject *result = NULL;
    ChargeRow *rows = NULL;
    ChargeAlloc *allocs = NULL;
    int64_t *tids = NULL;
    unsigned char *wanted = NULL;
    int32_t *stack = NULL;
    for (; got < 7; got++) {
        len[got] = charge_column(args[got < 5 ? got : got + 1], &v[got], widths[got], names[got]);
        if (len[got] < 0)
            goto done;
    }
    Py_ssize_t n = len[0], ntracks = len[4], m = len[5];
    if (len[1] != n || len[2] != n || len[3] != n || len[6] != m) {
        PyErr_SetString(PyExc_ValueError, "charge_allocations: columns of different lengths");
        goto done;
    }
    const int32_t *track = v[0].buf;
    const uint8_t *kind = v[1].buf;
    const int64_t *start = v[2].buf, *end = v[3].buf, *track_id = v[4].buf;
    const int64_t *atid = v[5].buf, *atime = v[6].buf;
    result = PyBytes_FromStringAndSize(NULL, m * 4);
    if (result == NULL)
        goto done;
    int32_t *out = (int32_t *)PyBytes_AS_STRING(result);
    for (Py_ssize_t i = 0; i < m; i++)
        out[i] = -1;
    if (m == 0 || n == 0)
        goto done;
    /* the tracks that allocated */
    tids = PyMem_Malloc((size_t)m * sizeof *tids);
    wanted = PyMem_Calloc((size_t)ntracks + 1, 1);
    allocs = PyMem_Malloc((size_t)m * sizeof *allocs);
    stack = PyMem_Malloc((size_t)n * sizeof *stack);
    if (tids == NULL || wanted == NULL || allocs == NULL || stack == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    memcpy(tids, atid, (size_t)m * sizeof *tids);
    qsort(tids, (size_t)m, sizeof *tids, cmp_i64);
    for (Py_ssize_t ti = 0; ti < ntracks; ti++)
        wanted[ti] = bsearch(&track_id[ti], tids, (size_t)m, sizeof *tids, cmp_i64) != NULL;
    Py_ssize_t nrows = 0;
    for (Py_ssize_t r = 0; r < n; r++)
        if (!(kind[r] & skip) && track[r] >= 0 && track[r] < ntracks && wanted[track[r]])
            nrows++;
    rows = PyMem_Malloc((size_t)(nrows ? nrows : 1) * sizeof *rows);
    if (rows == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    Py_ssize_t k = 0;
    for (Py_ssize_t r = 0; r < n; r++)
        if (!(kind[r] & skip) && track[r] >= 0 && track[r] < ntracks && wanted[track[r]])
            rows[k++] = (ChargeRow){track_id[track[r]], start[r], -end[r], (int32_t)r};
    qsort(rows, (size_t)nrows, sizeof *rows, cmp_charge_row);
    for (Py_ssize_t i = 0; i < m; i++)
        allocs[i] = (ChargeAlloc){atid[i], atime[i], i};
    qsort(allocs, (size_t)m, sizeof *allocs, cmp_charge_alloc);
    /* one walk: each track's allocations against its rows, innermost open */
    Py_ssize_t p = 0, depth = 0;
    int64_t cur = 0;
    int have = 0;
    for (Py_ssize_t a = 0; a < m; a++) {
        int64_t tid = allocs[a].tid, t = allocs[a].time;
        if (!have || tid != cur) {
            cur = tid;
            have = 1;
            depth = 0;
            while (p < nrows && rows[p].tid < tid)
                p++;
        }
        while (p < nrows && rows[p].tid == tid && rows[p].start <= t) {
            int32_t r = rows[p].row;
            while (depth && end[stack[depth - 1]] <= start[r])
                depth--;
            stack[depth++] = r;
            p++;
        }
        while (depth && end[stack[depth - 1]] <= t)
            depth--;
        out[allocs[a].i] = depth ? stack[depth - 1] : -1;
    }
    goto done;
fail:
    Py_CLEAR(result);
done:
    for (int c = 0; c < got; c++)
        PyBuffer_Release(&v[c]);
    PyMem_Free(tids);
    PyMem_Free(wanted);
    PyMem_Free(allocs);
    PyMem_Free(stack);
    PyMem_Free(rows);
    return result;
}

static PyMethodDef memory_methods[] = {
    {"_memory_start", memory_start, METH_VARARGS, "Start tracking allocations (profile_memory)."},
    {"_memory_stop", memory_stop, METH_NOARGS, "Stop tracking allocations; return the records."},
    {"_memory_peek", memory_peek, METH_NOARGS, "A copy of what _memory_stop returns, tracking on."},
    {"charge_allocations", (PyCFunction)(void (*)(void))charge_allocations, METH_FASTCALL,
     "charge_allocations(track, kind, start, end, track_ids, skip, alloc_tid, alloc_time) -> bytes (int32 rows)."},
    {"_memory_hooked", memory_hooked, METH_NOARGS, "(installed, on top): the state of aprof's allocator hooks."},
    {NULL, NULL, 0, NULL},
};

int
aprof_memory_init(PyObject *module)
{
    str_enabled_m = PyUnicode_InternFromString("enabled");
    str_recorder_m = PyUnicode_InternFromString("recorder");
    str_id_m = PyUnicode_InternFromString("id");
    if (str_enabled_m == NULL || str_recorder_m == NULL || str_id_m == NULL)
        return -1;
    if (PyModule_AddIntConstant(module, "MEMORY_RECORD_BYTES", (long)sizeof(MemRec)) < 0)
        return -1;
    return PyModule_AddFunctions(module, memory_methods);
}
