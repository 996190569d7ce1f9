/*
 * aprof._ctracer, second half: the range fast path (SPEC 3, issue #4 item 4).
 *
 * RangeCore is the base class of aprof.record_function when the extension is
 * built. It is __init__, __enter__ and __exit__ of _PyRangeCore in
 * aprof/_core/_record_function.py, in C: the same fields, the same two cases
 * handled inline, the same raw records. Those two cases are
 *
 *   - nothing listening (mode IDLE, no global callback): nothing to do;
 *   - only this context's profile listening (mode FAST): append the start
 *     tuple to the logical thread's list, and the end tuple naming it.
 *
 * Every other case (global or context callbacks, a second range open on the
 * same object) calls the Python method of record_function that the Python
 * path calls, so the two paths cannot drift apart where it matters.
 *
 * A plain range (a RangeBlock slot, see _cblocks.c) of a task's logical
 * thread (a TaskThread) goes to one list per generation shared by every
 * task, under the key TASK_BLOCKS (aprof/_core/_recorder.py), in a block
 * that names its task (RangeBlock.owner); consolidation gives each task its
 * blocks back (_events.consolidate). A task per request, each with a list
 * of its own, left that list and its TaskThread (the key) for as long as
 * the profile kept the request: two objects that the cyclic GC counted
 * towards its next young collection, which then came several times as
 * often as without aprof (issue 19). Blocks are no GC containers.
 *
 * Also here: `stepping`, the "logical thread stepping on this OS thread"
 * slot of aprof/_core/_threads.py, kept in C thread-local storage so the hot
 * path reads it with one load. Python code reads and writes `stepping.lt`
 * exactly as it does the threading.local of the pure-Python path.
 *
 * Everything runs with the GIL held (the extension is not built for
 * free-threaded Pythons; see _ctracer.c).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include "_cext.h"

/* The modes of aprof/_core/_callbacks.py (MODE_*). */
enum { MODE_OFF = 0, MODE_IDLE = 1, MODE_FAST = 2, MODE_SLOW = 3 };

/* Set once by _range_setup(). */
static PyObject *rf_state_var;   /* ContextVar RF_STATE */
static PyObject *current_lt;     /* current_logical_thread() */
static PyObject *task_blocks_key; /* TASK_BLOCKS (_task_blocks_setup), or NULL: each task keeps its own list */

static PyObject *str_list_for, *str_global_entries, *str_user_scope, *str_name, *str_spill, *str_take_shared,
    *str_slow_start, *str_end_general;

/* ------------------------------------------------------------------------ */
/* Slot readers                                                               */
/* ------------------------------------------------------------------------ */

/*
 * The hot path reads a handful of attributes of aprof's own __slots__
 * classes (RFState.mode, Recorder.state, LogicalThread.id, ...).
 * PyObject_GetAttr costs ~160 instructions for each (type lookup, then the
 * member descriptor's __get__); a slot is a pointer at a fixed offset. A
 * reader keeps the member descriptor given at setup and reads the slot
 * directly from any type whose attribute lookup resolves the name to that
 * descriptor, which is exactly when getattr would return the slot. The type
 * last checked is remembered with its version tag, which CPython changes
 * whenever the type or a base is modified. Anything else, and an empty
 * slot, goes through PyObject_GetAttr, which gives the same answer or
 * raises the same error.
 */
typedef struct {
    PyObject *name;           /* interned attribute name */
    PyObject *descr;          /* the member descriptor (strong), or NULL */
    Py_ssize_t offset;        /* the slot's offset; -1 when there is none */
    PyTypeObject *seen;       /* a type checked to resolve name to descr */
    unsigned int seen_version; /* its tp_version_tag then (never 0) */
} slot_reader;

static slot_reader rd_mode, rd_recorder, rd_state, rd_lists, rd_id, rd_os_thread_id, rd_task_ref, rd_with_stack,
    rd_budget;

/* Point `r` at cls.<name> if that is an object slot; else GetAttr always. */
static int
slot_reader_init(slot_reader *r, PyObject *cls, const char *name)
{
    Py_CLEAR(r->descr);
    r->offset = -1;
    r->seen = NULL;
    r->seen_version = 0;
    if (r->name == NULL && (r->name = PyUnicode_InternFromString(name)) == NULL)
        return -1;
    if (!PyType_Check(cls)) {
        PyErr_Format(PyExc_TypeError, "_range_setup: expected a class for .%s, got %R", name, cls);
        return -1;
    }
    PyObject *d = _PyType_Lookup((PyTypeObject *)cls, r->name); /* borrowed */
    if (d != NULL && Py_IS_TYPE(d, &PyMemberDescr_Type)) {
        PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
        if (m->type == T_OBJECT_EX) {
            r->descr = Py_NewRef(d);
            r->offset = m->offset;
        }
    }
    return 0;
}

/* Whether getattr(obj, r->name) on type `tp` reads r's slot. */
static int
slot_reader_check(slot_reader *r, PyTypeObject *tp)
{
    if (r->offset < 0 || tp->tp_getattro != PyObject_GenericGetAttr || _PyType_Lookup(tp, r->name) != r->descr)
        return 0;
    if (tp->tp_version_tag != 0) { /* 0: no tag; a modified type gets a new one */
        r->seen = tp;
        r->seen_version = tp->tp_version_tag;
    }
    return 1;
}

/* getattr(obj, r->name): new reference, NULL with an exception set. */
static inline PyObject *
slot_get(slot_reader *r, PyObject *obj)
{
    PyTypeObject *tp = Py_TYPE(obj);
    if ((tp == r->seen && tp->tp_version_tag == r->seen_version) || slot_reader_check(r, tp)) {
        PyObject *v = *(PyObject **)((char *)obj + r->offset);
        if (v != NULL)
            return Py_NewRef(v);
    }
    return PyObject_GetAttr(obj, r->name);
}

/* ------------------------------------------------------------------------ */
/* The stepping slot                                                          */
/* ------------------------------------------------------------------------ */

/* The LogicalThread whose step runs on this OS thread (a strong reference),
 * or NULL, and the context it was published in (borrowed, only compared),
 * or NULL for "trust it in any context". Written by aprof's task hooks
 * around every step they record, which clear it after; unlike a
 * threading.local it is not cleared when a thread ends, so a thread killed
 * mid-step would keep its reference.
 *
 * An asyncio task's step publishes its context too: on 3.12+ an eager task
 * runs its first step inside its spawner's step (inside the task's own
 * context), and its ranges are its own, not the spawner's (RELIABILITY
 * CP-06). While the thread runs another context than the published one,
 * the slot reads as empty and the lookup asks asyncio which task runs.
 * trio's instrument publishes from the runner's context, outside the
 * task's, so it publishes no context. */
APROF_TLS PyObject *aprof_stepping_lt = NULL;
APROF_TLS PyObject *aprof_stepping_ctx = NULL;

typedef struct {
    PyObject_HEAD
} Stepping;

/* The published logical thread if it holds in the running context
 * (borrowed), else NULL. */
static inline PyObject *
stepping_now(void)
{
    PyObject *lt = aprof_stepping_lt;
    if (lt != NULL && aprof_stepping_ctx != NULL && aprof_stepping_ctx != PyThreadState_Get()->context)
        return NULL;
    return lt;
}

static PyObject *
Stepping_get_lt(PyObject *self, void *closure)
{
    PyObject *lt = stepping_now();
    return Py_NewRef(lt != NULL ? lt : Py_None);
}

static int
Stepping_set_lt(PyObject *self, PyObject *value, void *closure)
{
    aprof_stepping_ctx = NULL;
    if (value == NULL || value == Py_None)
        Py_CLEAR(aprof_stepping_lt);
    else
        Py_XSETREF(aprof_stepping_lt, Py_NewRef(value));
    return 0;
}

static PyGetSetDef Stepping_getset[] = {
    {"lt", Stepping_get_lt, Stepping_set_lt, "The logical thread stepping on this OS thread, or None.", NULL},
    {NULL},
};

static PyTypeObject SteppingType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "aprof._ctracer.Stepping",
    .tp_basicsize = sizeof(Stepping),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Per-OS-thread slot: the logical thread stepping now (see aprof/_core/_threads.py).",
    .tp_getset = Stepping_getset,
};

/*
 * The current logical thread, as aprof/_core/_threads.py's
 * current_logical_thread() answers it, for its common cases:
 *
 *   1. a recorded task's step publishes itself in the stepping slot;
 *   2. an asyncio task (one aprof did not wrap, such as the task that
 *      started the profile) keeps its logical thread on the task: 3.11
 *      checks the context's hint against asyncio's current-task table,
 *      3.12+ asks asyncio's C current_task();
 *   3. with no asyncio task running on this OS thread: the running trio
 *      task's logical thread (kept in a side table), else the thread's own.
 *
 * Anything else (a task seen for the first time, trio, a loop callback, a
 * new thread) asks the Python function, which creates and caches what is
 * missing. Each check reads what the Python function reads, so both answer
 * the same.
 */
static PyObject *threads_dict; /* aprof._core._threads.__dict__ */
static PyObject *hint_var;     /* 3.11: _threads._hint; NULL on 3.12+ */
static PyObject *str_get_loop, *str_current_tasks_311, *str_asyncio_fns, *str_task_attr, *str_tls, *str_lt, *str_trio, *str_asyncio, *str_trio_run_context, *str_dict, *str_task, *str_side_table;

/* A lookup below did not find the answer: NULL, so the Python function
 * answers. An ordinary exception met on the way is cleared (the Python
 * function meets it again if it is real); KeyboardInterrupt and friends
 * stay set and propagate. */
static inline PyObject *
miss(void)
{
    if (PyErr_Occurred() && PyErr_ExceptionMatches(PyExc_Exception))
        PyErr_Clear();
    return NULL;
}

/* A global of aprof._core._threads, new reference; NULL if missing. */
static inline PyObject *
threads_global(PyObject *name)
{
    PyObject *v = PyDict_GetItemWithError(threads_dict, name);
    return v != NULL ? Py_NewRef(v) : NULL;
}

/* Whether sys.modules has `name` now; -1 on error. */
static inline int
imported(PyObject *name)
{
    /* The interpreter's module dict, not PySys_GetObject("modules"): on
     * 3.11 that builds and hashes a new str on every call (~40% of a plain
     * thread's logical-thread lookup). */
    PyObject *modules = PyImport_GetModuleDict(); /* borrowed */
    if (modules == NULL || !PyDict_Check(modules))
        return -1;
    PyObject *m = PyDict_GetItemWithError(modules, name);
    return m != NULL ? 1 : PyErr_Occurred() ? -1 : 0;
}

#if PY_VERSION_HEX < 0x030C0000
/* 3.11: the hint, if it is still the running task's. New reference or NULL. */
static PyObject *
hinted_task_lt(PyObject *tasks)
{
    PyObject *hint = NULL, *tid = NULL, *ref = NULL, *task = NULL, *loop = NULL, *result = NULL;
    if (PyContextVar_Get(hint_var, Py_None, &hint) < 0 || hint == NULL || hint == Py_None)
        goto done;
    tid = slot_get(&rd_os_thread_id, hint);
    if (tid == NULL || !PyLong_CheckExact(tid) || PyLong_AsUnsignedLong(tid) != PyThread_get_thread_ident())
        goto done;
    ref = slot_get(&rd_task_ref, hint);
    if (ref == NULL || !PyWeakref_CheckRef(ref))
        goto done;
    task = PyWeakref_GetObject(ref); /* borrowed: made strong at once */
    if (task == NULL || task == Py_None) {
        task = NULL;
        goto done;
    }
    Py_INCREF(task);
    /* The task's own loop: a logical thread holds no loop (nor its task),
     * so recording keeps no finished loop alive. */
    loop = PyObject_CallMethodNoArgs(task, str_get_loop);
    if (loop == NULL)
        goto done;
    PyObject *cur = PyDict_GetItemWithError(tasks, loop); /* borrowed, only compared */
    if (cur == task)
        result = Py_NewRef(hint);
done:
    Py_XDECREF(loop);
    Py_XDECREF(task);
    Py_XDECREF(ref);
    Py_XDECREF(tid);
    Py_XDECREF(hint);
    return result != NULL ? result : miss();
}
#endif

/* No asyncio task runs on this thread: the running trio task's logical
 * thread (from trio's run context and the side table), else the thread's
 * own (_threads._tls.lt). New reference or NULL. */
static PyObject *
no_asyncio_lt(void)
{
    PyObject *trio_ctx = threads_global(str_trio_run_context);
    if (trio_ctx == NULL || trio_ctx == Py_None) {
        Py_XDECREF(trio_ctx);
        if (imported(str_trio) != 0) /* imported: Python finds its run context first */
            return miss();
    }
    else {
        /* trio's run context is a threading.local: its __dict__ is this
         * thread's, and reading "task" there raises nothing when no trio
         * run is here (getattr would, at ~1.4 us). */
        PyObject *d = PyObject_GetAttr(trio_ctx, str_dict);
        Py_DECREF(trio_ctx);
        if (d == NULL || !PyDict_Check(d)) {
            Py_XDECREF(d);
            return miss();
        }
        PyObject *task = PyDict_GetItemWithError(d, str_task);
        Py_XINCREF(task);
        Py_DECREF(d);
        if (task == NULL && PyErr_Occurred())
            return miss();
        if (task != NULL && task != Py_None) {
            /* trio's Task has __slots__: its logical thread is in the side table. */
            PyObject *side = threads_global(str_side_table), *lt = NULL;
            PyObject *key = PyLong_FromVoidPtr(task);
            if (side != NULL && key != NULL && PyDict_Check(side)) {
                lt = PyDict_GetItemWithError(side, key);
                Py_XINCREF(lt);
            }
            Py_XDECREF(key);
            Py_XDECREF(side);
            Py_DECREF(task);
            return lt != NULL ? lt : miss(); /* not there yet: Python makes it */
        }
        Py_XDECREF(task);
    }
    PyObject *tls = threads_global(str_tls);
    if (tls == NULL)
        return miss();
    PyObject *lt = PyObject_GetAttr(tls, str_lt);
    Py_DECREF(tls);
    return lt != NULL ? lt : miss();
}

/* Before _threads has bound asyncio's primitives: no task can run unless
 * asyncio is imported (then Python binds them). */
static PyObject *
unbound_lt(void)
{
    return imported(str_asyncio) != 0 ? miss() : no_asyncio_lt();
}

/* Cases 2 and 3 above. New reference, or NULL (see miss()). */
static PyObject *
known_lt(void)
{
#if PY_VERSION_HEX < 0x030C0000
    PyObject *tasks = threads_global(str_current_tasks_311), *lt;
    if (tasks == Py_None)
        lt = unbound_lt();
    else if (tasks == NULL || !PyDict_CheckExact(tasks))
        lt = miss();
    else if (PyDict_GET_SIZE(tasks) == 0) /* no asyncio task runs anywhere */
        lt = no_asyncio_lt();
    else
        lt = hint_var != NULL ? hinted_task_lt(tasks) : miss();
    Py_XDECREF(tasks);
    return lt;
#else
    PyObject *fns = threads_global(str_asyncio_fns), *loop = NULL, *task = NULL, *lt = NULL;
    if (fns == Py_None) {
        Py_DECREF(fns);
        return unbound_lt();
    }
    if (fns == NULL || !PyTuple_CheckExact(fns) || PyTuple_GET_SIZE(fns) != 2)
        goto done;
    loop = PyObject_CallNoArgs(PyTuple_GET_ITEM(fns, 0));
    if (loop == NULL)
        goto done;
    if (loop == Py_None) { /* no loop runs on this thread */
        lt = no_asyncio_lt();
        goto done;
    }
    task = PyObject_CallOneArg(PyTuple_GET_ITEM(fns, 1), loop);
    if (task == NULL || task == Py_None)
        goto done;
    /* None: aprof's task hooks saw the task and do not record it. */
#if PY_VERSION_HEX >= 0x030D0000
    if (PyObject_GetOptionalAttr(task, str_task_attr, &lt) < 0)
        goto done;
#else
    if (_PyObject_LookupAttr(task, str_task_attr, &lt) < 0)
        goto done;
#endif
    if (lt == Py_None)
        Py_CLEAR(lt);
done:
    Py_XDECREF(task);
    Py_XDECREF(loop);
    Py_XDECREF(fns);
    return lt != NULL ? lt : miss();
#endif
}

/*
 * The answer, cached per OS thread for as long as nothing can have changed
 * it. What changes it: a task starting or ending a step (asyncio and trio
 * both run every step, and every loop callback, inside Context.run of the
 * task's or the callback's context, and CPython counts each context enter
 * and exit in the thread state's context_ver), another thread state on this
 * OS thread (its id), a fork (the generation, bumped by the child), and
 * aprof's task hooks (the stepping slot, checked first). So the lookup runs
 * once per step or callback that records a range, not twice per range.
 *
 * The cached object is held by the thread state's dict, which CPython
 * clears when the thread ends; the TLS copy is borrowed and is used only
 * while the thread state that holds it is the one running.
 */
typedef struct {
    PyThreadState *ts;
    uint64_t ts_id;
    uint64_t ver;
    uint64_t gen;
    PyObject *lt; /* borrowed from the thread state's dict */
} lt_cache;

static APROF_TLS lt_cache tl_lt_cache;
static uint64_t lt_generation = 1;
static PyObject *str_lt_cache_key;

static void
lt_cache_store(PyThreadState *ts, uint64_t ver, uint64_t gen, PyObject *lt)
{
    lt_cache *c = &tl_lt_cache;
    c->lt = NULL;
    if (ver != ts->context_ver || gen != lt_generation)
        return; /* the lookup itself moved on: do not cache a stale answer */
    PyObject *d = PyThreadState_GetDict(); /* borrowed */
    if (d == NULL || PyDict_SetItem(d, str_lt_cache_key, lt) < 0) {
        PyErr_Clear(); /* no cache this time; the answer stands */
        return;
    }
    /* Dropping the old entry can run a finalizer that records a range and
     * stores its own answer; keep a borrowed pointer only to what the dict
     * holds. */
    if (PyDict_GetItemWithError(d, str_lt_cache_key) != lt) {
        PyErr_Clear();
        return;
    }
    c->ts = ts;
    c->ts_id = ts->id;
    c->ver = ver;
    c->gen = gen;
    c->lt = lt;
}

/* The current logical thread. New reference, NULL with an exception set. */
static inline PyObject *
logical_thread(void)
{
    PyObject *published = stepping_now();
    if (published != NULL)
        return Py_NewRef(published);
    PyThreadState *ts = PyThreadState_Get();
    lt_cache *c = &tl_lt_cache;
    uint64_t ver = ts->context_ver, gen = lt_generation;
    if (c->lt != NULL && c->ts == ts && c->ts_id == ts->id && c->ver == ver && c->gen == gen)
        return Py_NewRef(c->lt);
    PyObject *lt = known_lt();
    if (lt == NULL) {
        if (PyErr_Occurred() || (lt = PyObject_CallNoArgs(current_lt)) == NULL)
            return NULL;
    }
    lt_cache_store(ts, ver, gen, lt);
    return lt;
}

/* _forget_logical_threads(): drop every OS thread's cached answer. */
static PyObject *
forget_logical_threads(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    lt_generation++;
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------------ */
/* RangeCore                                                                  */
/* ------------------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    PyObject *name;
    PyObject *args;
    PyObject *rec;  /* the open range: its RangeBlock or the start's list (fast), or a RecordFunction */
    PyObject *lt;   /* fast path: the logical thread that started it */
    PyObject *more; /* further open ranges on this object (Python-managed list) */
    Py_ssize_t idx; /* fast path: the range's slot in rec, or its start tuple's index */
} RangeCore;

#define IS_SET(o) ((o) != NULL && (o) != Py_None)

/* record_function's argument checks; -1 with TypeError naming the bad one. */
static int
check_name_args(PyObject *name, PyObject *a)
{
    if (!PyUnicode_Check(name)) {
        PyObject *tn = PyType_GetName(Py_TYPE(name));
        PyErr_Format(PyExc_TypeError, "record_function: name must be a str, got %S", tn);
        Py_XDECREF(tn);
        return -1;
    }
    if (a != Py_None && !PyUnicode_Check(a)) {
        PyObject *tn = PyType_GetName(Py_TYPE(a));
        PyErr_Format(PyExc_TypeError, "record_function: args must be a str or None, got %S", tn);
        Py_XDECREF(tn);
        return -1;
    }
    return 0;
}

static int
RangeCore_init(RangeCore *self, PyObject *args, PyObject *kwds)
{
    PyObject *name, *a = Py_None;
    Py_ssize_t n = PyTuple_GET_SIZE(args);
    if (kwds == NULL && n >= 1 && n <= 2) {
        name = PyTuple_GET_ITEM(args, 0);
        if (n == 2)
            a = PyTuple_GET_ITEM(args, 1);
    }
    else {
        static char *kwlist[] = {"name", "args", NULL};
        if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|O:record_function", kwlist, &name, &a))
            return -1;
    }
    if (check_name_args(name, a) < 0)
        return -1;
    Py_XSETREF(self->name, Py_NewRef(name));
    Py_XSETREF(self->args, Py_NewRef(a));
    Py_CLEAR(self->rec);
    Py_CLEAR(self->more);
    return 0;
}

/* Whether a global callback is registered: the Python path's
 * `if _callbacks.global_entries`. _callbacks._publish_globals(), the one
 * place that assigns global_entries, tells us through
 * _set_global_callbacks(), so the hot path reads an int, not a module
 * dict. */
static int global_callbacks_on;
/* The one global profile's Recorder when it is all that listens globally
 * (_callbacks.global_fast): ranges in contexts with no profile of their own
 * take fast_start into it. NULL otherwise. */
static PyObject *global_fast_recorder;

static PyObject *
set_global_callbacks(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "_set_global_callbacks(on: bool, fast_recorder: Recorder | None)");
        return NULL;
    }
    int on = PyObject_IsTrue(args[0]);
    if (on < 0)
        return NULL;
    global_callbacks_on = on;
    Py_XSETREF(global_fast_recorder, args[1] == Py_None ? NULL : Py_NewRef(args[1]));
    Py_RETURN_NONE;
}

static inline int
call_method(RangeCore *self, PyObject *name)
{
    PyObject *r = PyObject_CallMethodNoArgs((PyObject *)self, name);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

static long
state_mode(PyObject *st)
{
    PyObject *m = slot_get(&rd_mode, st);
    if (m == NULL)
        return -1;
    long mode = PyLong_AsLong(m);
    Py_DECREF(m);
    return mode;
}

/* Take a raw record out of the garbage collector's lists. A record holds
 * only strs, ints and None, so it can never be part of a cycle; CPython
 * untracks such tuples itself, but only when a collection first looks at
 * them. Untracking at once keeps a profile's hundreds of thousands of
 * records from being traversed by every collection until then (measured:
 * a range in a task 1.96 us -> 0.69 us on 3.11). */
static inline void
untrack_atomic(PyObject *tup)
{
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(tup); i++) {
        PyObject *o = PyTuple_GET_ITEM(tup, i);
        if (!(o == Py_None || PyUnicode_CheckExact(o) || PyLong_CheckExact(o)))
            return;
    }
    PyObject_GC_UnTrack(tup);
}

/* ------------------------------------------------------------------------ */
/* with_stack: the caller's stack, kept raw until stop                         */
/* ------------------------------------------------------------------------ */

/*
 * profile(with_stack=True) attaches the Python stack at each range's start
 * (SPEC 8.3). Naming every frame then (file, line, qualified name: a line
 * table lookup and three tuples per frame, all tracked by the GC) cost ~16 us
 * per range at depth 23. The seed keeps debug handles while recording and
 * names them at stop; this keeps the code objects and each frame's last
 * instruction offset: a tuple of code objects (untracked by the GC, like
 * code objects themselves) and one bytes object of uint32 offsets.
 * aprof._post._events names them at stop and drops the code objects.
 *
 * stack_raw(skip, prefix) -> (codes, lastis) walks from the caller,
 * skipping `skip` frames and then every leading frame whose file starts
 * with `prefix` (aprof's own: the stack starts at the user's code). It uses
 * the public frame API: PyFrame_GetBack creates the frame object of an
 * outer frame the first time, which its interpreter frame then keeps, so a
 * loop of ranges at one depth creates them once.
 */
static PyObject *
stack_raw(Py_ssize_t skip, PyObject *prefix)
{
    PyFrameObject *f = PyEval_GetFrame(); /* borrowed */
    Py_XINCREF(f);
    for (; f != NULL && skip > 0; skip--)
        Py_SETREF(f, PyFrame_GetBack(f));
    /* aprof's leading frames (record_function's general path, the
     * decorator's wrappers, ...) */
    while (f != NULL) {
        PyCodeObject *code = PyFrame_GetCode(f);
        int mine = PyUnicode_Tailmatch(code->co_filename, prefix, 0, PY_SSIZE_T_MAX, -1);
        Py_DECREF(code);
        if (mine < 0) {
            Py_DECREF(f);
            return NULL;
        }
        if (!mine)
            break;
        Py_SETREF(f, PyFrame_GetBack(f));
    }
    enum { LOCAL = 64 };
    PyObject *local_codes[LOCAL];
    uint32_t local_lastis[LOCAL];
    PyObject **codes = local_codes;
    uint32_t *lastis = local_lastis;
    Py_ssize_t n = 0, cap = LOCAL;
    PyObject *result = NULL;
    while (f != NULL) {
        if (n == cap) {
            Py_ssize_t ncap = cap * 2;
            PyObject **nc = PyMem_Malloc((size_t)ncap * sizeof *nc);
            uint32_t *nl = PyMem_Malloc((size_t)ncap * sizeof *nl);
            if (nc == NULL || nl == NULL) {
                PyMem_Free(nc);
                PyMem_Free(nl);
                PyErr_NoMemory();
                goto done;
            }
            memcpy(nc, codes, (size_t)n * sizeof *nc);
            memcpy(nl, lastis, (size_t)n * sizeof *nl);
            if (codes != local_codes) {
                PyMem_Free(codes);
                PyMem_Free(lastis);
            }
            codes = nc;
            lastis = nl;
            cap = ncap;
        }
        codes[n] = (PyObject *)PyFrame_GetCode(f); /* new reference */
        int lasti = PyFrame_GetLasti(f);
        lastis[n] = lasti < 0 ? UINT32_MAX : (uint32_t)lasti;
        n++;
        Py_SETREF(f, PyFrame_GetBack(f));
    }
    PyObject *tup = PyTuple_New(n);
    PyObject *raw = tup == NULL ? NULL : PyBytes_FromStringAndSize((const char *)lastis, n * (Py_ssize_t)sizeof *lastis);
    if (raw != NULL) {
        for (Py_ssize_t i = 0; i < n; i++) {
            PyTuple_SET_ITEM(tup, i, codes[i]); /* steals */
            codes[i] = NULL;
        }
        result = PyTuple_Pack(2, tup, raw);
        /* Code objects, a bytes: nothing a cycle could go through. Out of
         * the GC's lists at once, as the records holding them (see
         * untrack_atomic). */
        PyObject_GC_UnTrack(tup);
        if (result != NULL)
            PyObject_GC_UnTrack(result);
    }
    Py_XDECREF(tup);
    Py_XDECREF(raw);
done:
    Py_XDECREF(f);
    for (Py_ssize_t i = 0; i < n; i++)
        Py_XDECREF(codes[i]);
    if (codes != local_codes) {
        PyMem_Free(codes);
        PyMem_Free(lastis);
    }
    return result;
}

/* The prefix of aprof's own files (set by _set_stack_prefix). */
static PyObject *stack_prefix;

static PyObject *
stack_here(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyLong_Check(args[0]) || !PyUnicode_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "stack_here(skip: int, prefix: str)");
        return NULL;
    }
    Py_ssize_t skip = PyLong_AsSsize_t(args[0]);
    if (skip < 0 && PyErr_Occurred())
        return NULL;
    return stack_raw(skip, args[1]);
}

static PyObject *
set_stack_prefix(PyObject *module, PyObject *prefix)
{
    if (!PyUnicode_Check(prefix)) {
        PyErr_SetString(PyExc_TypeError, "_set_stack_prefix(prefix: str)");
        return NULL;
    }
    Py_XSETREF(stack_prefix, Py_NewRef(prefix));
    Py_RETURN_NONE;
}

/* The fast path's start: take the next slot of the RangeBlock at the tail
 * of the logical thread's list of the profile `recorder` records into (a new
 * block is appended when the tail is anything else), or append
 * (name, "user_scope", now, args, raw_stack) when it records stacks or the
 * name or args is a str subclass (a block holds exact strs only, so that it
 * need not be a GC container). */
static int
fast_start(RangeCore *self, PyObject *recorder)
{
    PyObject *ps = slot_get(&rd_state, recorder);
    if (ps == NULL)
        return -1;
    if (ps == Py_None) { /* the profile stopped */
        Py_DECREF(ps);
        return 0;
    }
    int rc = -1;
    PyObject *lists = NULL, *lst = NULL, *tup = NULL, *lt = NULL;
    PyObject *budget = slot_get(&rd_budget, ps);
    if (budget == NULL)
        goto done;
    if (budget != Py_None) { /* a bounded profile (issue 19): room for one more range? */
        if (!Budget_Check(budget)) {
            Py_DECREF(budget);
            PyErr_SetString(PyExc_TypeError, "aprof: a profile's budget is not a Budget");
            goto done;
        }
        int drop = aprof_budget_take((Budget *)budget, BUDGET_RANGE, 1);
        Py_DECREF(budget);
        if (drop < 0) /* a KeyboardInterrupt in the ring's on_full: the program's */
            goto done;
        if (drop) {
            rc = 0;
            goto done;
        }
    }
    else
        Py_DECREF(budget);
    lt = logical_thread();
    if (lt == NULL)
        goto done;
    lists = slot_get(&rd_lists, ps);
    if (lists == NULL)
        goto done;
    PyObject *with_stack = slot_get(&rd_with_stack, ps);
    if (with_stack == NULL)
        goto done;
    PyObject *stack = NULL, *name = self->name != NULL ? self->name : Py_None,
             *a = self->args != NULL ? self->args : Py_None;
    int stack_on = with_stack == Py_True && stack_prefix != NULL;
    int blocked = !stack_on && PyUnicode_CheckExact(name) && (a == Py_None || PyUnicode_CheckExact(a));
    Py_DECREF(with_stack);
    /* A task's plain ranges go to the generation's one list of task blocks
     * (TASK_BLOCKS), each block naming its task: a task per request then
     * leaves no list of its own, nor its logical thread as the key of one,
     * for the collector to count (see the top of the file). */
    int64_t owner = 0;
    PyObject *o_name = NULL, *o_kind = NULL, *o_os_tid = NULL, *key = lt, **o_block = NULL;
    if (blocked && task_blocks_key != NULL && PyDict_CheckExact(lists) &&
        aprof_task_owner(lt, &owner, &o_name, &o_kind, &o_os_tid, &o_block))
        key = task_blocks_key;
    if (PyDict_CheckExact(lists)) {
        lst = PyDict_GetItemWithError(lists, key);
        if (lst != NULL)
            Py_INCREF(lst);
        else if (PyErr_Occurred())
            goto done;
    }
    if (lst == NULL) {
        /* The logical thread's first range: ProfilerState.list_for, as one
         * setdefault (a signal handler recording in between keeps its list). */
        if (PyDict_CheckExact(lists)) {
            PyObject *fresh = PyList_New(0);
            lst = fresh != NULL ? Py_XNewRef(PyDict_SetDefault(lists, key, fresh)) : NULL;
            Py_XDECREF(fresh);
        }
        else
            lst = PyObject_CallMethodOneArg(ps, str_list_for, lt);
        if (lst == NULL)
            goto done;
    }
    if (!PyList_CheckExact(lst)) {
        PyErr_SetString(PyExc_TypeError, "aprof: a profile's event list is not a list");
        goto done;
    }
    if (stack_on) {
        /* Before the clock read, so the range measures the user's code. */
        if ((stack = stack_raw(0, stack_prefix)) == NULL)
            goto done;
    }
    else {
        if (blocked) {
            Py_ssize_t len = PyList_GET_SIZE(lst);
            /* The block to take a slot of: a thread's, the one at its list's
             * tail; a task's, the one it took last if it is still in this
             * list (this generation's), wherever other tasks' blocks put it. */
            PyObject *tail = owner == 0 ? (len > 0 ? PyList_GET_ITEM(lst, len - 1) : NULL)
                                        : (o_block != NULL ? *o_block : NULL);
            RangeBlock *b;
            if (tail != NULL && RangeBlock_Check(tail) && ((RangeBlock *)tail)->scope == str_user_scope &&
                ((RangeBlock *)tail)->owner == owner &&
                (owner == 0 || (((RangeBlock *)tail)->at < len && PyList_GET_ITEM(lst, ((RangeBlock *)tail)->at) == tail)))
                b = (RangeBlock *)Py_NewRef(tail);
            else if ((b = aprof_block_new(str_user_scope)) == NULL)
                goto done;
            else {
                if (owner != 0) {
                    aprof_block_own(b, owner, o_name, o_kind, o_os_tid);
                    b->at = len;
                }
                if (PyList_Append(lst, (PyObject *)b) < 0) {
                    Py_DECREF(b);
                    goto done;
                }
                if (owner != 0 && o_block != NULL)
                    Py_XSETREF(*o_block, Py_NewRef((PyObject *)b));
            }
            Py_ssize_t slot = aprof_block_open(b, name, a);
            if (slot < 0) {
                Py_DECREF(b);
                goto done;
            }
            b->slots[slot].start = (int64_t)now_ns(); /* after the bookkeeping: the range measures the user's code */
            self->idx = slot;
            Py_XSETREF(self->rec, (PyObject *)b);
            Py_XSETREF(self->lt, Py_NewRef(lt));
            rc = 0;
            goto done;
        }
    }
    tup = PyTuple_New(stack == NULL ? 4 : 5);
    if (tup == NULL) {
        Py_XDECREF(stack);
        goto done;
    }
    if (stack != NULL)
        PyTuple_SET_ITEM(tup, 4, stack);
    PyObject *t = PyLong_FromUnsignedLongLong(now_ns());
    if (t == NULL)
        goto done;
    PyTuple_SET_ITEM(tup, 0, Py_NewRef(name));
    PyTuple_SET_ITEM(tup, 1, Py_NewRef(str_user_scope));
    PyTuple_SET_ITEM(tup, 2, t);
    PyTuple_SET_ITEM(tup, 3, Py_NewRef(a));
    if (stack == NULL)
        untrack_atomic(tup);
    else if (!PyObject_GC_IsTracked(stack) && PyUnicode_CheckExact(PyTuple_GET_ITEM(tup, 0)) &&
             (PyTuple_GET_ITEM(tup, 3) == Py_None || PyUnicode_CheckExact(PyTuple_GET_ITEM(tup, 3))))
        PyObject_GC_UnTrack(tup); /* strs, an int and the untracked stack */
    Py_ssize_t idx = PyList_GET_SIZE(lst);
    if (PyList_Append(lst, tup) < 0)
        goto done;
    self->idx = idx;
    Py_XSETREF(self->rec, Py_NewRef(lst));
    Py_XSETREF(self->lt, Py_NewRef(lt));
    rc = 0;
done:
    Py_XDECREF(tup);
    Py_XDECREF(lst);
    Py_XDECREF(lists);
    Py_XDECREF(lt);
    Py_DECREF(ps);
    return rc;
}

static PyObject *
RangeCore_enter(RangeCore *self, PyObject *Py_UNUSED(ignored))
{
    if (IS_SET(self->rec) && call_method(self, str_spill) < 0)
        return NULL;
    PyObject *st;
    if (PyContextVar_Get(rf_state_var, NULL, &st) < 0)
        return NULL;
    if (st == NULL) {
        PyErr_SetString(PyExc_LookupError, "aprof: RF_STATE has no value");
        return NULL;
    }
    int rc = 0;
    long mode = state_mode(st);
    if (mode == -1 && PyErr_Occurred()) {
        rc = -1;
    }
    else if (mode == MODE_IDLE) {
        if (global_fast_recorder != NULL) { /* a global profile alone: inline, as a context one */
            PyObject *recorder = Py_NewRef(global_fast_recorder); /* fast_start may run Python that resets it */
            rc = fast_start(self, recorder);
            Py_DECREF(recorder);
        }
        else
            rc = global_callbacks_on ? call_method(self, str_slow_start) : 0;
    }
    else if (mode == MODE_FAST) {
        if (global_callbacks_on) {
            rc = call_method(self, str_slow_start);
        }
        else {
            PyObject *recorder = slot_get(&rd_recorder, st);
            rc = recorder == NULL ? -1 : fast_start(self, recorder);
            Py_XDECREF(recorder);
        }
    }
    else if (mode == MODE_SLOW) {
        rc = call_method(self, str_slow_start);
    }
    Py_DECREF(st);
    if (rc < 0)
        return NULL;
    return Py_NewRef((PyObject *)self);
}

static PyObject *
RangeCore_exit(RangeCore *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "__exit__ expected 3 arguments, got %zd", nargs);
        return NULL;
    }
    if (IS_SET(self->more) && call_method(self, str_take_shared) < 0)
        return NULL;
    PyObject *rec = self->rec; /* we take its reference */
    if (!IS_SET(rec))
        Py_RETURN_NONE;
    self->rec = NULL;
    PyObject *et = args[0];
    if (RangeBlock_Check(rec)) {
        /* The end goes into the start's slot. After stop nobody reads the
         * block: a late end is dropped free. */
        int64_t now = (int64_t)now_ns();
        PyObject *lt = logical_thread(), *tid = NULL, *exc = NULL, *result = NULL;
        long long end_tid = -1;
        if (lt == NULL || (tid = slot_get(&rd_id, lt)) == NULL)
            goto block_done;
        if ((end_tid = PyLong_AsLongLong(tid)) == -1 && PyErr_Occurred())
            goto block_done;
        if (et != Py_None) {
            if ((exc = PyObject_GetAttr(et, str_name)) == NULL)
                goto block_done;
            if (!PyUnicode_CheckExact(exc)) { /* a block holds exact strs only (no GC container) */
                Py_SETREF(exc, PyObject_Str(exc));
                if (exc != NULL && !PyUnicode_CheckExact(exc))
                    Py_SETREF(exc, PyUnicode_FromObject(exc)); /* a subclass's exact copy */
                if (exc == NULL)
                    goto block_done;
            }
        }
        aprof_block_close((RangeBlock *)rec, self->idx, now, end_tid, exc);
        result = Py_NewRef(Py_None);
    block_done:
        Py_XDECREF(exc);
        Py_XDECREF(tid);
        Py_XDECREF(lt);
        Py_DECREF(rec);
        return result;
    }
    if (!PyList_CheckExact(rec)) {
        /* The general path's RecordFunction. */
        PyObject *r = PyObject_CallMethodObjArgs((PyObject *)self, str_end_general, rec, et, NULL);
        Py_DECREF(rec);
        if (r == NULL)
            return NULL;
        Py_DECREF(r);
        Py_RETURN_NONE;
    }
    /* The end tuple goes to the starting thread's list, naming the start's
     * index. After stop nobody reads that list: a late end is dropped free. */
    uint64_t now = now_ns();
    PyObject *lt = NULL, *tid = NULL, *exc = NULL, *tup = NULL, *result = NULL;
    lt = logical_thread();
    if (lt == NULL)
        goto done;
    tid = slot_get(&rd_id, lt);
    if (tid == NULL)
        goto done;
    if (et == Py_None)
        exc = Py_NewRef(Py_None);
    else if ((exc = PyObject_GetAttr(et, str_name)) == NULL)
        goto done;
    tup = PyTuple_New(4);
    if (tup == NULL)
        goto done;
    PyObject *i = PyLong_FromSsize_t(self->idx);
    if (i == NULL)
        goto done;
    PyTuple_SET_ITEM(tup, 0, i);
    PyObject *t = PyLong_FromUnsignedLongLong(now);
    if (t == NULL)
        goto done;
    PyTuple_SET_ITEM(tup, 1, t);
    PyTuple_SET_ITEM(tup, 2, Py_NewRef(tid));
    PyTuple_SET_ITEM(tup, 3, Py_NewRef(exc));
    untrack_atomic(tup);
    if (PyList_Append(rec, tup) < 0)
        goto done;
    result = Py_NewRef(Py_None);
done:
    Py_XDECREF(tup);
    Py_XDECREF(exc);
    Py_XDECREF(tid);
    Py_XDECREF(lt);
    Py_DECREF(rec);
    return result;
}

static int
RangeCore_traverse(RangeCore *self, visitproc visit, void *arg)
{
    Py_VISIT(self->name);
    Py_VISIT(self->args);
    Py_VISIT(self->rec);
    Py_VISIT(self->lt);
    Py_VISIT(self->more);
    return 0;
}

static int
RangeCore_clear(RangeCore *self)
{
    Py_CLEAR(self->name);
    Py_CLEAR(self->args);
    Py_CLEAR(self->rec);
    Py_CLEAR(self->lt);
    Py_CLEAR(self->more);
    return 0;
}

static void
RangeCore_dealloc(RangeCore *self)
{
    PyObject_GC_UnTrack(self);
    RangeCore_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef RangeCore_methods[] = {
    {"__enter__", (PyCFunction)RangeCore_enter, METH_NOARGS, "Open the range (see record_function)."},
    {"__exit__", (PyCFunction)(void (*)(void))RangeCore_exit, METH_FASTCALL, "Close the range."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef RangeCore_members[] = {
    {"name", T_OBJECT, offsetof(RangeCore, name), 0, "The range's name."},
    {"args", T_OBJECT, offsetof(RangeCore, args), 0, "The string kept with the event, or None."},
    {"_rec", T_OBJECT, offsetof(RangeCore, rec), 0, NULL},
    {"_lt", T_OBJECT, offsetof(RangeCore, lt), 0, NULL},
    {"_more", T_OBJECT, offsetof(RangeCore, more), 0, NULL},
    {"_idx", T_PYSSIZET, offsetof(RangeCore, idx), 0, NULL},
    {NULL},
};

static PyTypeObject RangeCoreType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "aprof._ctracer.RangeCore",
    .tp_basicsize = sizeof(RangeCore),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "RangeCore(name, args=None)\n--\n\nrecord_function's fields, __init__, __enter__ and __exit__, in C.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)RangeCore_init,
    .tp_dealloc = (destructor)RangeCore_dealloc,
    .tp_traverse = (traverseproc)RangeCore_traverse,
    .tp_clear = (inquiry)RangeCore_clear,
    .tp_methods = RangeCore_methods,
    .tp_members = RangeCore_members,
};

/*
 * Calling the class. `record_function("x")` goes through type.__call__: an
 * argument tuple, tp_new, then tp_init parsing that tuple. The class given
 * to _range_vectorcall() gets a vectorcall that does the same work straight
 * from the call's arguments, for the one shape every range uses (a name and
 * maybe args, positional). Anything else, or a class whose __new__ or
 * __init__ is no longer RangeCore's (a subclass, or one patched later:
 * tp_vectorcall is never inherited, and the slots are checked per call),
 * takes type.__call__ as before.
 */
static PyObject *
type_call_default(PyObject *type, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t n = PyVectorcall_NARGS(nargsf), nk = kwnames != NULL ? PyTuple_GET_SIZE(kwnames) : 0;
    PyObject *tuple = PyTuple_New(n), *kwargs = NULL, *result = NULL;
    if (tuple == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++)
        PyTuple_SET_ITEM(tuple, i, Py_NewRef(args[i]));
    if (nk > 0) {
        if ((kwargs = PyDict_New()) == NULL)
            goto done;
        for (Py_ssize_t i = 0; i < nk; i++) {
            if (PyDict_SetItem(kwargs, PyTuple_GET_ITEM(kwnames, i), args[n + i]) < 0)
                goto done;
        }
    }
    result = PyType_Type.tp_call(type, tuple, kwargs);
done:
    Py_XDECREF(kwargs);
    Py_DECREF(tuple);
    return result;
}

static PyObject *
range_type_vectorcall(PyObject *type, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    PyTypeObject *tp = (PyTypeObject *)type;
    Py_ssize_t n = PyVectorcall_NARGS(nargsf);
    if (kwnames != NULL || n < 1 || n > 2 || tp->tp_new != PyType_GenericNew ||
        tp->tp_init != (initproc)RangeCore_init || tp->tp_alloc != PyType_GenericAlloc)
        return type_call_default(type, args, nargsf, kwnames);
    PyObject *name = args[0], *a = n == 2 ? args[1] : Py_None;
    if (check_name_args(name, a) < 0)
        return NULL;
    RangeCore *self = (RangeCore *)tp->tp_alloc(tp, 0);
    if (self == NULL)
        return NULL;
    self->name = Py_NewRef(name);
    self->args = Py_NewRef(a);
    return (PyObject *)self;
}

/* _range_vectorcall(cls): calls of cls (record_function) skip type.__call__. */
static PyObject *
range_vectorcall(PyObject *module, PyObject *cls)
{
    if (!PyType_Check(cls) || !PyType_IsSubtype((PyTypeObject *)cls, &RangeCoreType)) {
        PyErr_Format(PyExc_TypeError, "_range_vectorcall: expected a subclass of RangeCore, got %R", cls);
        return NULL;
    }
    ((PyTypeObject *)cls)->tp_vectorcall = range_type_vectorcall;
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------------ */
/* The EXECUTOR range (issue 20)                                              */
/* ------------------------------------------------------------------------ */

/*
 * _executor_range(fn, args, kwargs, fwd, seq, submit_ns) is
 * aprof._core._propagation._run_executor_range_py in C: a job handed to a
 * worker (a process pool's, a thread pool's, to_thread's) run as an
 * EXECUTOR range. The one case handled inline is the Python function's
 * inline case: only this context's profile listens (mode FAST, no global
 * callback); it appends the same start tuple
 *
 *   (name, "executor", start, None, seq, fwd, None, stack, KIND_RANGE, submit_ns)
 *
 * and the same end tuple (idx, end, lt.id, exception name or None) to the
 * same list. Nothing listening calls fn; every other case calls the Python
 * function itself (given by _executor_setup), so the two cannot drift apart.
 */
static PyObject *executor_general; /* _run_executor_range_py */
static PyObject *executor_name_of; /* _propagation._name_of */
static PyObject *str_executor, *str_take;

/* kwargs: a dict, or NULL for none. */
static inline PyObject *
call_job(PyObject *fn, PyObject *args, PyObject *kwargs)
{
    if (kwargs != NULL && PyDict_CheckExact(kwargs) && PyDict_GET_SIZE(kwargs) == 0)
        kwargs = NULL;
    return PyObject_Call(fn, args, kwargs);
}

/* args = (fn, args: tuple, kwargs: dict or NULL, fwd, seq, submit_ns). */
static PyObject *
executor_range_impl(PyObject *const *args)
{
    if (executor_general == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "aprof: _executor_setup was not called");
        return NULL;
    }
    PyObject *fn = args[0], *fargs = args[1], *fkwargs = args[2];
    PyObject *st;
    if (PyContextVar_Get(rf_state_var, NULL, &st) < 0)
        return NULL;
    if (st == NULL) {
        PyErr_SetString(PyExc_LookupError, "aprof: RF_STATE has no value");
        return NULL;
    }
    long mode = state_mode(st);
    if (mode == -1 && PyErr_Occurred()) {
        Py_DECREF(st);
        return NULL;
    }
    if (mode != MODE_FAST || global_callbacks_on) {
        Py_DECREF(st);
        if (mode == MODE_OFF || (mode == MODE_IDLE && !global_callbacks_on))
            return call_job(fn, fargs, fkwargs);
        if (fkwargs != NULL)
            return PyObject_Vectorcall(executor_general, args, 6, NULL);
        PyObject *kw = PyDict_New(), *r = NULL;
        if (kw != NULL) {
            PyObject *full[6] = {args[0], args[1], kw, args[3], args[4], args[5]};
            r = PyObject_Vectorcall(executor_general, full, 6, NULL);
            Py_DECREF(kw);
        }
        return r;
    }
    /* Only this context's profile listens: the records, inline. */
    PyObject *recorder = slot_get(&rd_recorder, st);
    Py_DECREF(st);
    if (recorder == NULL)
        return NULL;
    PyObject *ps = slot_get(&rd_state, recorder);
    Py_DECREF(recorder);
    if (ps == NULL)
        return NULL;
    PyObject *budget = NULL, *lt = NULL, *lists = NULL, *lst = NULL, *tid = NULL, *stack = NULL, *name = NULL,
             *start = NULL, *result = NULL;
    if (ps == Py_None) { /* stopped */
        Py_DECREF(ps);
        return call_job(fn, fargs, fkwargs);
    }
    if ((budget = slot_get(&rd_budget, ps)) == NULL)
        goto fail;
    if (budget != Py_None) { /* a bounded profile: room for one more range? */
        int drop;
        if (Budget_Check(budget)) {
            if ((drop = aprof_budget_take((Budget *)budget, BUDGET_RANGE, 1)) < 0)
                goto fail;
        }
        else { /* the pure-Python Budget: its take() */
            PyObject *kind = PyLong_FromLong(BUDGET_RANGE), *r = NULL;
            if (kind != NULL)
                r = PyObject_CallMethodOneArg(budget, str_take, kind);
            Py_XDECREF(kind);
            if (r == NULL)
                goto fail;
            int ok = PyObject_IsTrue(r);
            Py_DECREF(r);
            if (ok < 0)
                goto fail;
            drop = !ok;
        }
        if (drop) {
            result = call_job(fn, fargs, fkwargs);
            goto done;
        }
    }
    if ((lt = logical_thread()) == NULL)
        goto fail;
    if ((lists = slot_get(&rd_lists, ps)) == NULL)
        goto fail;
    if (PyDict_CheckExact(lists)) {
        lst = PyDict_GetItemWithError(lists, lt);
        if (lst != NULL)
            Py_INCREF(lst);
        else if (PyErr_Occurred())
            goto fail;
    }
    if (lst == NULL && (lst = PyObject_CallMethodOneArg(ps, str_list_for, lt)) == NULL)
        goto fail;
    if (!PyList_CheckExact(lst)) {
        PyErr_SetString(PyExc_TypeError, "aprof: a profile's event list is not a list");
        goto fail;
    }
    PyObject *with_stack = slot_get(&rd_with_stack, ps);
    if (with_stack == NULL)
        goto fail;
    int want_stack = PyObject_IsTrue(with_stack);
    Py_DECREF(with_stack);
    if (want_stack < 0)
        goto fail;
    if (want_stack) {
        if (stack_prefix == NULL) {
            PyErr_SetString(PyExc_RuntimeError, "aprof: _set_stack_prefix was not called");
            goto fail;
        }
        if ((stack = stack_raw(0, stack_prefix)) == NULL) /* from the caller: aprof's frames left out */
            goto fail;
    }
    else
        stack = Py_NewRef(Py_None);
    /* fn.__qualname__ for a plain function, else _name_of(fn) (also when
     * that is empty), as the Python function names it. */
    if (Py_IS_TYPE(fn, &PyFunction_Type)) {
        name = Py_NewRef(((PyFunctionObject *)fn)->func_qualname);
        int empty = PyObject_Not(name);
        if (empty < 0)
            goto fail;
        if (empty)
            Py_CLEAR(name);
    }
    if (name == NULL && (name = PyObject_CallOneArg(executor_name_of, fn)) == NULL)
        goto fail;
    PyObject *t0 = PyLong_FromUnsignedLongLong(now_ns());
    if (t0 == NULL)
        goto fail;
    PyObject *kind = PyLong_FromLong(BUDGET_RANGE); /* KIND_RANGE: a small int, cached */
    if (kind == NULL) {
        Py_DECREF(t0);
        goto fail;
    }
    start = PyTuple_Pack(10, name, str_executor, t0, Py_None, args[4], args[3], Py_None, stack, kind, args[5]);
    Py_DECREF(t0);
    Py_DECREF(kind);
    if (start == NULL)
        goto fail;
    untrack_atomic(start);
    if (PyList_Append(lst, start) < 0)
        goto fail;
    /* No Python code runs between the append and here (the GIL is held,
     * no signal handler runs): the start is the list's last item. */
    Py_ssize_t idx = PyList_GET_SIZE(lst) - 1;
    if ((tid = slot_get(&rd_id, lt)) == NULL)
        goto fail;
    result = call_job(fn, fargs, fkwargs);
    {
#if PY_VERSION_HEX >= 0x030C0000
        PyObject *raised = NULL, *exc = NULL, *end = NULL;
        if (result == NULL) {
            raised = PyErr_GetRaisedException();
            exc = raised != NULL ? PyObject_GetAttr((PyObject *)Py_TYPE(raised), str_name) : NULL;
#else
        PyObject *ptype = NULL, *pvalue = NULL, *ptb = NULL, *exc = NULL, *end = NULL;
        if (result == NULL) {
            PyErr_Fetch(&ptype, &pvalue, &ptb);
            PyErr_NormalizeException(&ptype, &pvalue, &ptb); /* type(exc), as the Python function reads it */
            exc = pvalue != NULL ? PyObject_GetAttr((PyObject *)Py_TYPE(pvalue), str_name) : NULL;
#endif
            if (exc == NULL) { /* the job's exception goes on; its name as None if it cannot be read */
                PyErr_Clear();
                exc = Py_NewRef(Py_None);
            }
        }
        else
            exc = Py_NewRef(Py_None);
        PyObject *i = PyLong_FromSsize_t(idx), *t1 = PyLong_FromUnsignedLongLong(now_ns());
        if (i != NULL && t1 != NULL)
            end = PyTuple_Pack(4, i, t1, tid, exc);
        Py_XDECREF(i);
        Py_XDECREF(t1);
        Py_DECREF(exc);
        int rc = -1;
        if (end != NULL) {
            untrack_atomic(end);
            rc = PyList_Append(lst, end);
            Py_DECREF(end);
        }
        if (result == NULL) {
            if (rc < 0)
                PyErr_Clear(); /* the job's own exception wins */
#if PY_VERSION_HEX >= 0x030C0000
            PyErr_SetRaisedException(raised);
#else
            PyErr_Restore(ptype, pvalue, ptb);
#endif
        }
        else if (rc < 0)
            Py_CLEAR(result);
    }
    goto done;
fail:
    Py_CLEAR(result);
done:
    Py_XDECREF(start);
    Py_XDECREF(name);
    Py_XDECREF(stack);
    Py_XDECREF(tid);
    Py_XDECREF(lst);
    Py_XDECREF(lists);
    Py_XDECREF(lt);
    Py_XDECREF(budget);
    Py_DECREF(ps);
    return result;
}

static PyObject *
executor_range(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6 || !PyTuple_Check(args[1]) || !PyDict_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "_executor_range(fn, args: tuple, kwargs: dict, fwd, seq, submit_ns)");
        return NULL;
    }
    return executor_range_impl(args);
}

/* The current logical thread, as the ranges take it: stepping.lt or
 * current_logical_thread() (a process pool's submit links its job to it). */
static PyObject *
current_logical_thread_c(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    return logical_thread();
}

static PyObject *
executor_setup(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyCallable_Check(args[0]) || !PyCallable_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "_executor_setup(general, name_of)");
        return NULL;
    }
    Py_XSETREF(executor_general, Py_NewRef(args[0]));
    Py_XSETREF(executor_name_of, Py_NewRef(args[1]));
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------------ */
/* A process pool's job (issue 20)                                            */
/* ------------------------------------------------------------------------ */

/*
 * PoolCallCore is the base class of aprof._integrations._processes._PoolCall
 * when the extension is built: a job handed to a process pool under a
 * profile (fn, the parent profile's directory, the submit's sequence
 * number, its logical thread, its time). It is _PyPoolCallCore of that
 * module in C: built from the five fields (as unpickling builds it),
 * pickled as (type(self), (fn, dir, seq, fwd, submit_ns)), and called in
 * the worker: the first job of a parent profile joins it (_pool_join, in
 * Python), every job notes its link in the worker profile's seqs and fwds
 * and runs as an EXECUTOR range (executor_range_impl) in the worker
 * profile's context, or a copy of it when that context is entered already
 * (a job run from inside another, or from another thread: the twin holds
 * a lock while it runs there, to the same effect).
 */
typedef struct {
    PyObject_HEAD
    PyObject *fn, *dir, *seq, *fwd, *submit_ns;
} PoolCall;

static PyObject *pool_workers; /* _processes._workers */
static PyObject *pool_join;    /* _processes._pool_join */
static PyObject *str_ctx, *str_closed, *str_seqs, *str_fwds, *str_append;

static PyTypeObject PoolCallType;

static PyObject *
PoolCall_new(PyTypeObject *tp, PyObject *args, PyObject *kwds)
{
    PyObject *f[5];
    if (kwds == NULL && PyTuple_GET_SIZE(args) == 5) {
        for (int i = 0; i < 5; i++)
            f[i] = PyTuple_GET_ITEM(args, i);
    }
    else {
        static char *kwlist[] = {"fn", "dir", "seq", "fwd", "submit_ns", NULL};
        if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOOO:_PoolCall", kwlist, &f[0], &f[1], &f[2], &f[3], &f[4]))
            return NULL;
    }
    PoolCall *self = (PoolCall *)tp->tp_alloc(tp, 0);
    if (self == NULL)
        return NULL;
    self->fn = Py_NewRef(f[0]);
    self->dir = Py_NewRef(f[1]);
    self->seq = Py_NewRef(f[2]);
    self->fwd = Py_NewRef(f[3]);
    self->submit_ns = Py_NewRef(f[4]);
    return (PyObject *)self;
}

static PyObject *
PoolCall_reduce(PoolCall *self, PyObject *Py_UNUSED(ignored))
{
    PyObject *fields = PyTuple_Pack(5, self->fn, self->dir, self->seq, self->fwd, self->submit_ns);
    if (fields == NULL)
        return NULL;
    PyObject *r = PyTuple_Pack(2, (PyObject *)Py_TYPE(self), fields);
    Py_DECREF(fields);
    return r;
}

static int
append_to(PyObject *w, PyObject *name, PyObject *item)
{
    PyObject *col = PyObject_GetAttr(w, name);
    if (col == NULL)
        return -1;
    PyObject *r = PyObject_CallMethodOneArg(col, str_append, item);
    Py_DECREF(col);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

static PyObject *
PoolCall_call(PoolCall *self, PyObject *args, PyObject *kwargs)
{
    if (pool_workers == NULL || pool_join == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "aprof: _pool_setup was not called");
        return NULL;
    }
    PyObject *w = PyDict_GetItemWithError(pool_workers, self->dir); /* borrowed */
    if (w != NULL)
        Py_INCREF(w);
    else if (PyErr_Occurred() || (w = PyObject_CallOneArg(pool_join, self->dir)) == NULL)
        return NULL;
    PyObject *ctx = NULL, *result = NULL;
    int closed = 1; /* None: aprof cannot profile here */
    if (w != Py_None) {
        PyObject *c = PyObject_GetAttr(w, str_closed);
        if (c == NULL)
            goto done;
        closed = PyObject_IsTrue(c);
        Py_DECREF(c);
        if (closed < 0)
            goto done;
    }
    if (!closed && (ctx = PyObject_GetAttr(w, str_ctx)) == NULL)
        goto done;
    if (closed || !PyContext_CheckExact(ctx)) {
        /* Unprofiled here, or the parent asked for the profile already. */
        result = call_job(self->fn, args, kwargs);
        goto done;
    }
    if (append_to(w, str_seqs, self->seq) < 0 || append_to(w, str_fwds, self->fwd) < 0)
        goto done;
    PyObject *run_in = Py_NewRef(ctx);
    if (PyContext_Enter(run_in) < 0) {
        /* Entered already (a job run from inside another, or from another
         * thread): a copy, as the twin takes when its lock is held. */
        if (!PyErr_ExceptionMatches(PyExc_RuntimeError)) {
            Py_DECREF(run_in);
            goto done;
        }
        PyErr_Clear();
        Py_SETREF(run_in, PyContext_Copy(run_in));
        if (run_in == NULL)
            goto done;
        if (PyContext_Enter(run_in) < 0) {
            Py_DECREF(run_in);
            goto done;
        }
    }
    /* fwd 0: the submitter is in another process; the merge points this
     * range at it through the session's parent_link. */
    PyObject *zero = PyLong_FromLong(0);
    if (zero != NULL) {
        PyObject *a[6] = {self->fn, args, kwargs, zero, self->seq, self->submit_ns};
        result = executor_range_impl(a);
        Py_DECREF(zero);
    }
    if (PyContext_Exit(run_in) < 0)
        Py_CLEAR(result);
    Py_DECREF(run_in);
done:
    Py_XDECREF(ctx);
    Py_DECREF(w);
    return result;
}

static int
PoolCall_traverse(PoolCall *self, visitproc visit, void *arg)
{
    Py_VISIT(self->fn);
    Py_VISIT(self->dir);
    Py_VISIT(self->seq);
    Py_VISIT(self->fwd);
    Py_VISIT(self->submit_ns);
    return 0;
}

static int
PoolCall_clear(PoolCall *self)
{
    Py_CLEAR(self->fn);
    Py_CLEAR(self->dir);
    Py_CLEAR(self->seq);
    Py_CLEAR(self->fwd);
    Py_CLEAR(self->submit_ns);
    return 0;
}

static void
PoolCall_dealloc(PoolCall *self)
{
    PyObject_GC_UnTrack(self);
    PoolCall_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef PoolCall_methods[] = {
    {"__reduce__", (PyCFunction)PoolCall_reduce, METH_NOARGS, "(type(self), (fn, dir, seq, fwd, submit_ns))."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef PoolCall_members[] = {
    {"fn", T_OBJECT, offsetof(PoolCall, fn), READONLY, "The job's callable."},
    {"dir", T_OBJECT, offsetof(PoolCall, dir), READONLY, "The parent profile's directory."},
    {"seq", T_OBJECT, offsetof(PoolCall, seq), READONLY, "The submit's sequence number."},
    {"fwd", T_OBJECT, offsetof(PoolCall, fwd), READONLY, "The submitting logical thread's id."},
    {"submit_ns", T_OBJECT, offsetof(PoolCall, submit_ns), READONLY, "The submit's time."},
    {NULL},
};

static PyTypeObject PoolCallType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "aprof._ctracer.PoolCallCore",
    .tp_basicsize = sizeof(PoolCall),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "PoolCallCore(fn, dir, seq, fwd, submit_ns)\n--\n\nA process pool's job under a profile, in C.",
    .tp_new = PoolCall_new,
    .tp_call = (ternaryfunc)PoolCall_call,
    .tp_dealloc = (destructor)PoolCall_dealloc,
    .tp_traverse = (traverseproc)PoolCall_traverse,
    .tp_clear = (inquiry)PoolCall_clear,
    .tp_methods = PoolCall_methods,
    .tp_members = PoolCall_members,
};

static PyObject *
pool_setup(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyDict_Check(args[0]) || !PyCallable_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "_pool_setup(workers: dict, pool_join)");
        return NULL;
    }
    Py_XSETREF(pool_workers, Py_NewRef(args[0]));
    Py_XSETREF(pool_join, Py_NewRef(args[1]));
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------------ */
/* Module glue                                                                */
/* ------------------------------------------------------------------------ */

static PyObject *
range_setup(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6 || !PyDict_Check(args[1]) || !PyCallable_Check(args[2]) || !PyDict_Check(args[3]) ||
        !PyTuple_CheckExact(args[5]) || PyTuple_GET_SIZE(args[5]) != 4) {
        PyErr_SetString(PyExc_TypeError, "_range_setup(rf_state, callbacks_dict, current_logical_thread, "
                                         "threads_dict, hint_var, (RFState, Recorder, ProfilerState, LogicalThread))");
        return NULL;
    }
    PyObject *rf_state = PyTuple_GET_ITEM(args[5], 0), *recorder = PyTuple_GET_ITEM(args[5], 1),
             *profiler_state = PyTuple_GET_ITEM(args[5], 2), *logical = PyTuple_GET_ITEM(args[5], 3);
    if (slot_reader_init(&rd_mode, rf_state, "mode") < 0 || slot_reader_init(&rd_recorder, rf_state, "recorder") < 0 ||
        slot_reader_init(&rd_state, recorder, "state") < 0 || slot_reader_init(&rd_lists, profiler_state, "lists") < 0 ||
        slot_reader_init(&rd_id, logical, "id") < 0 || slot_reader_init(&rd_os_thread_id, logical, "os_thread_id") < 0 ||
        slot_reader_init(&rd_task_ref, logical, "_task_ref") < 0 ||
        slot_reader_init(&rd_with_stack, profiler_state, "with_stack") < 0 ||
        slot_reader_init(&rd_budget, profiler_state, "budget") < 0)
        return NULL;
    Py_XSETREF(rf_state_var, Py_NewRef(args[0]));
    PyObject *g = PyDict_GetItemWithError(args[1], str_global_entries); /* borrowed */
    int on = g != NULL ? PyObject_IsTrue(g) : PyErr_Occurred() ? -1 : 0;
    if (on < 0)
        return NULL;
    global_callbacks_on = on;
    Py_XSETREF(current_lt, Py_NewRef(args[2]));
    Py_XSETREF(threads_dict, Py_NewRef(args[3]));
    Py_XSETREF(hint_var, args[4] == Py_None ? NULL : Py_NewRef(args[4]));
    lt_generation++;
    Py_RETURN_NONE;
}

/* _task_blocks_setup(TASK_BLOCKS): tasks' plain ranges go to the list
 * under that key; _task_blocks_setup(None): to each task's own list. */
static PyObject *
task_blocks_setup(PyObject *module, PyObject *key)
{
    Py_XSETREF(task_blocks_key, key == Py_None ? NULL : Py_NewRef(key));
    Py_RETURN_NONE;
}

/* Which attributes the slot readers read directly (for the tests). */
static PyObject *
range_slots(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    slot_reader *all[] = {&rd_mode,         &rd_recorder, &rd_state,     &rd_lists,
                          &rd_id,           &rd_os_thread_id, &rd_task_ref, &rd_with_stack, &rd_budget};
    PyObject *names = PyList_New(0);
    for (size_t i = 0; names != NULL && i < sizeof all / sizeof all[0]; i++) {
        if (all[i]->offset >= 0 && PyList_Append(names, all[i]->name) < 0)
            Py_CLEAR(names);
    }
    return names;
}

static PyMethodDef range_functions[] = {
    {"_range_setup", (PyCFunction)(void (*)(void))range_setup, METH_FASTCALL,
     "Give the range fast path RF_STATE, _callbacks.__dict__, current_logical_thread, _threads.__dict__, "
     "the 3.11 hint variable and the classes whose slots it reads."},
    {"_range_vectorcall", range_vectorcall, METH_O, "Let calls of the class (record_function) skip type.__call__."},
    {"_task_blocks_setup", task_blocks_setup, METH_O,
     "Put tasks' plain ranges in the list under this key, in blocks that name their task (None: each task's own)."},
    {"_set_global_callbacks", (PyCFunction)(void (*)(void))set_global_callbacks, METH_FASTCALL,
     "Tell the range fast path whether _callbacks.global_entries is non-empty, and the global recorder it may "
     "record into inline."},
    {"_range_slots", range_slots, METH_NOARGS, "The attributes the range fast path reads as slots."},
    {"stack_here", (PyCFunction)(void (*)(void))stack_here, METH_FASTCALL,
     "stack_here(skip, prefix) -> (codes, lastis): the caller's stack, raw (see with_stack)."},
    {"_set_stack_prefix", set_stack_prefix, METH_O,
     "The prefix of aprof's own files, whose leading frames the fast path's stacks leave out."},
    {"_executor_range", (PyCFunction)(void (*)(void))executor_range, METH_FASTCALL,
     "_executor_range(fn, args, kwargs, fwd, seq, submit_ns): fn(*args, **kwargs) as an EXECUTOR range."},
    {"_executor_setup", (PyCFunction)(void (*)(void))executor_setup, METH_FASTCALL,
     "Give _executor_range the Python function it calls for the cases it does not handle inline, and _name_of."},
    {"_logical_thread", current_logical_thread_c, METH_NOARGS,
     "The current logical thread: stepping.lt or current_logical_thread(), with the ranges' cache."},
    {"_pool_setup", (PyCFunction)(void (*)(void))pool_setup, METH_FASTCALL,
     "Give PoolCallCore the worker profiles' dict and the function that joins a parent profile."},
    {"_forget_logical_threads", forget_logical_threads, METH_NOARGS,
     "Drop every OS thread's cached logical thread (after a fork)."},
    {NULL, NULL, 0, NULL},
};

static int
intern(PyObject **slot, const char *s)
{
    *slot = PyUnicode_InternFromString(s);
    return *slot == NULL ? -1 : 0;
}

int
aprof_ranges_init(PyObject *module)
{
    if (intern(&str_lt_cache_key, "aprof.logical_thread") < 0 || intern(&str_list_for, "list_for") < 0 ||
        intern(&str_global_entries, "global_entries") < 0 ||
        intern(&str_user_scope, "user_scope") < 0 || intern(&str_name, "__name__") < 0 ||
        intern(&str_spill, "_spill") < 0 || intern(&str_take_shared, "_take_shared") < 0 ||
        intern(&str_slow_start, "_slow_start") < 0 || intern(&str_end_general, "_end_general") < 0 ||
        intern(&str_current_tasks_311, "_current_tasks_311") < 0 || intern(&str_get_loop, "get_loop") < 0 ||
        intern(&str_asyncio_fns, "_asyncio_fns") < 0 || intern(&str_task_attr, "_aprof_logical_thread") < 0 ||
        intern(&str_tls, "_tls") < 0 || intern(&str_lt, "lt") < 0 ||
        intern(&str_trio, "trio") < 0 || intern(&str_asyncio, "asyncio") < 0 ||
        intern(&str_trio_run_context, "_trio_run_context") < 0 || intern(&str_dict, "__dict__") < 0 ||
        intern(&str_task, "task") < 0 || intern(&str_side_table, "_side_table") < 0 ||
        intern(&str_executor, "executor") < 0 || intern(&str_take, "take") < 0 || intern(&str_ctx, "ctx") < 0 ||
        intern(&str_closed, "closed") < 0 || intern(&str_seqs, "seqs") < 0 || intern(&str_fwds, "fwds") < 0 ||
        intern(&str_append, "append") < 0)
        return -1;
    if (PyType_Ready(&SteppingType) < 0 || PyType_Ready(&RangeCoreType) < 0 || PyType_Ready(&PoolCallType) < 0)
        return -1;
    PyObject *stepping = PyType_GenericNew(&SteppingType, NULL, NULL);
    if (stepping == NULL)
        return -1;
    int rc = PyModule_AddObjectRef(module, "RangeCore", (PyObject *)&RangeCoreType);
    if (rc == 0)
        rc = PyModule_AddObjectRef(module, "PoolCallCore", (PyObject *)&PoolCallType);
    if (rc == 0)
        rc = PyModule_AddObjectRef(module, "stepping", stepping);
    Py_DECREF(stepping);
    if (rc == 0)
        rc = PyModule_AddFunctions(module, range_functions);
    return rc;
}
