/*
 * aprof._ctracer, third part: the asyncio task hooks' hot path (SPEC 7.1-7.3).
 *
 * aprof records an asyncio (or uvloop) task without touching the task, its
 * coroutine or the loop's task factory (SPEC 15.6). The pure-Python twin of
 * everything here is in aprof/_integrations/_asyncio.py; the design is in
 * docs/how-it-works.md ("Tasks, running and waiting").
 *
 *   CallSoonHook  set as an instance attribute `call_soon` on a loop. The C
 *                 Task (and the Python one) schedules every step and every
 *                 wakeup through `loop.call_soon(cb, ..., context=ctx)`,
 *                 looked up as a method, so the hook sees each of them. A
 *                 step or wakeup of a task aprof records is handed on
 *                 wrapped in a StepCall; everything else is handed on as is.
 *   StepCall      stamps the step's start and end in the task's StepLog and
 *                 publishes the task as the one stepping on this thread
 *                 (with its context: see _cranges.c). Its repr and its
 *                 attributes are the wrapped callback's, so Handle reprs and
 *                 asyncio's debug messages do not change.
 *   StepLog       a growable array of uint64 step times (start, end, ...).
 *   the eager watch  (3.12+) a dict watcher on asyncio's current-task table.
 *                 An eager task's first step runs inside its constructor,
 *                 not through call_soon; asyncio swaps the current task
 *                 around it (a MODIFIED event from the spawner to the child,
 *                 then back), which is when the step starts and ends.
 *
 * Everything runs with the GIL held (the extension is not built for
 * free-threaded Pythons; see _ctracer.c).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include "_cext.h"

/* Set by _tasks_setup(). */
static PyTypeObject *task_thread_type; /* aprof._integrations._tasks.TaskThread (exact type) */
/* The TaskThread slots the C paths read and write: the steps (every step),
 * a task's record at its end, its fields at its creation. Their offsets,
 * found by name in _tasks_setup (all or none). */
enum {
    TT_ID, TT_NAME, TT_KIND, TT_OS_TID, TT_CORO, TT_SPAWN_NS, TT_SEQ, TT_FWD, TT_WAITS, TT_SITE, TT_MORE, TT_RECORDS,
    TT_IDX, TT_TASK_REF, TT_STEPS, TT_READY, TT_STATE, TT_BLOCK, TT_COUNT
};
static const char *const tt_slots[TT_COUNT] = {"id",         "name",     "kind",      "os_thread_id", "coro_name",
                                               "spawn_ns",   "seq",      "fwd",       "waits",        "spawn_site",
                                               "_more",      "_records", "_idx",      "_task_ref",    "steps",
                                               "ready_ns",   "_state",   "_block"};
static Py_ssize_t off_tt[TT_COUNT];
static PyObject *py_task_type;         /* asyncio.tasks._PyTask, or None */
static PyObject *py_step_fn, *py_wakeup_fn; /* its __step and __wakeup functions, or None */
static PyObject *on_first_step;        /* first_step(tt): the tracer runs */
static PyObject *on_task_done;         /* task_done(tt, task) */
static PyObject *on_eager_step;        /* eager_started(task, spawner) -> TaskThread | None */
static PyObject *on_first_scheduled;   /* first_scheduled(task, context) -> TaskThread | None */
static PyObject *tracer_running;       /* aprof._core._tracer.publishing: running tracers and samplers */
static PyObject *on_long_wait;         /* note_wait(tt, task, start_ns, end_ns): describe a long wait */
static uint64_t long_wait_ns = 1000000; /* a step after a wait this long calls on_long_wait */

static PyObject *str_self, *str_done, *str_append;
static PyTypeObject *step_meth_wrapper_type; /* _asyncio.TaskStepMethWrapper, once seen */
typedef struct {
    PyObject_HEAD
    PyObject *sw_task;
} step_wrapper_view;
static int step_wrapper_layout = 0; /* 1: sw_task is __self__; -1: it is not; 0: not known yet */
static PyMethodDef *wakeup_def;              /* the C Task's task_wakeup, once seen */

/* Save and restore the exception being raised around our own work. */
#if PY_VERSION_HEX >= 0x030C0000
typedef PyObject *saved_exc;
#define SAVE_EXC(s) ((s) = PyErr_GetRaisedException())
#define RESTORE_EXC(s) PyErr_SetRaisedException(s)
#else
typedef struct {
    PyObject *t, *v, *tb;
} saved_exc;
#define SAVE_EXC(s) PyErr_Fetch(&(s).t, &(s).v, &(s).tb)
#define RESTORE_EXC(s) PyErr_Restore((s).t, (s).v, (s).tb)
#endif

/* getattr(obj, name) or NULL without an exception when it has none. */
static inline int
optional_attr(PyObject *obj, PyObject *name, PyObject **result)
{
#if PY_VERSION_HEX >= 0x030D0000
    return PyObject_GetOptionalAttr(obj, name, result);
#else
    return _PyObject_LookupAttr(obj, name, result);
#endif
}

static PyObject *c_task_type;
static PyObject *str_task_attr;
static Py_ssize_t task_dict_offset; /* the C Task's instance dict, or 0: read it through getattr */

/* getattr(task, aprof's attribute) as optional_attr says it: for a C Task
 * straight from its instance dict (set up in _tasks_setup). */
static inline int
task_attr(PyObject *task, PyObject **result)
{
    if (APROF_LIKELY(task_dict_offset > 0 && Py_TYPE(task) == (PyTypeObject *)c_task_type)) {
        PyObject *dict = *(PyObject **)((char *)task + task_dict_offset);
        PyObject *v = dict != NULL ? PyDict_GetItemWithError(dict, str_task_attr) : NULL;
        if (v == NULL && PyErr_Occurred())
            return -1;
        *result = Py_XNewRef(v);
        return v != NULL;
    }
    return optional_attr(task, str_task_attr, result);
}

/* setattr(task, aprof's attribute, value): for a C Task with its instance
 * dict made, straight into it. */
static inline int
task_attr_set(PyObject *task, PyObject *value)
{
    if (APROF_LIKELY(task_dict_offset > 0 && Py_TYPE(task) == (PyTypeObject *)c_task_type)) {
        PyObject *dict = *(PyObject **)((char *)task + task_dict_offset);
        if (dict == NULL) { /* made as setattr makes it */
            dict = PyObject_GenericGetDict(task, NULL);
            if (dict == NULL)
                return -1;
            Py_DECREF(dict); /* the task holds it */
        }
        if (PyDict_CheckExact(dict))
            return PyDict_SetItem(dict, str_task_attr, value);
    }
    return PyObject_SetAttr(task, str_task_attr, value);
}

/* Report a failure of aprof's own bookkeeping without raising it into the
 * program: it is written as unraisable, once per kind of failure is not
 * needed here (these run once per task, and only fail on a bug). */
static void
report_unraisable(const char *where)
{
    PyObject *msg = PyUnicode_FromFormat("aprof task hook (%s)", where);
    PyErr_WriteUnraisable(msg);
    Py_XDECREF(msg);
}

/* ------------------------------------------------------------------------ */
/* StepLog                                                                    */
/* ------------------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    uint64_t *v;
    Py_ssize_t n, cap;
    Py_ssize_t exports; /* buffers handed out: no change while any is alive */
    Py_ssize_t shape;   /* n, for the exported buffers' shape */
} StepLog;

static PyTypeObject StepLogType;

static int
steplog_push(StepLog *s, uint64_t t)
{
    if (APROF_UNLIKELY(s->exports > 0)) {
        PyErr_SetString(PyExc_BufferError, "StepLog: cannot change while a buffer is exported");
        return -1;
    }
    if (s->n == s->cap) {
        /* Most tasks take a step or two (a request's: its first, and one
         * after a wait): room for 2, then twice as much each time. A
         * finished task's log is cut to its times (steplog_fit), which
         * then most often has nothing to cut. */
        Py_ssize_t cap = s->cap < 4 ? 4 : s->cap * 2;
        uint64_t *v = PyMem_Realloc(s->v, (size_t)cap * sizeof(uint64_t));
        if (v == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n++] = t;
    return 0;
}

/* Append `t` to a task's steps: a StepLog in C, anything else (the discard
 * deque of a task no profile records any more) through its append(). */
static inline int
steps_push(PyObject *steps, uint64_t t)
{
    if (APROF_LIKELY(Py_IS_TYPE(steps, &StepLogType)))
        return steplog_push((StepLog *)steps, t);
    PyObject *i = PyLong_FromUnsignedLongLong(t);
    if (i == NULL)
        return -1;
    PyObject *r = PyObject_CallMethodOneArg(steps, str_append, i);
    Py_DECREF(i);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

static PyObject *
StepLog_append(StepLog *self, PyObject *arg)
{
    unsigned long long t = PyLong_AsUnsignedLongLong(arg);
    if (t == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    if (steplog_push(self, (uint64_t)t) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static Py_ssize_t
StepLog_len(StepLog *self)
{
    return self->n;
}

static PyObject *
StepLog_item(StepLog *self, Py_ssize_t i)
{
    if (i < 0 || i >= self->n) {
        PyErr_SetString(PyExc_IndexError, "StepLog index out of range");
        return NULL;
    }
    return PyLong_FromUnsignedLongLong(self->v[i]);
}

static int
StepLog_getbuffer(StepLog *self, Py_buffer *view, int flags)
{
    if (flags & PyBUF_WRITABLE) {
        PyErr_SetString(PyExc_BufferError, "StepLog: the buffer is read-only");
        view->obj = NULL;
        return -1;
    }
    /* One dimension of n unsigned 64-bit ints; a plain byte buffer for a
     * consumer that asks for no format (array.frombytes). */
    self->shape = self->n;
    view->obj = Py_NewRef((PyObject *)self);
    view->buf = self->v;
    view->len = self->n * (Py_ssize_t)sizeof(uint64_t);
    view->readonly = 1;
    view->itemsize = (flags & PyBUF_FORMAT) ? (Py_ssize_t)sizeof(uint64_t) : 1;
    view->format = (flags & PyBUF_FORMAT) ? "Q" : NULL;
    view->ndim = 1;
    if (flags & PyBUF_ND) {
        view->shape = (flags & PyBUF_FORMAT) ? &self->shape : &view->len;
    }
    else {
        view->shape = NULL;
    }
    view->strides = (flags & PyBUF_STRIDES) == PyBUF_STRIDES ? &view->itemsize : NULL;
    view->suboffsets = NULL;
    view->internal = NULL;
    self->exports++;
    return 0;
}

static void
StepLog_releasebuffer(StepLog *self, Py_buffer *view)
{
    self->exports--;
}

static void
StepLog_dealloc(StepLog *self)
{
    PyMem_Free(self->v);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* A finished task's log, its room cut to its times: the task's record
 * then holds it as it is (no array made, nothing more for the collector,
 * which never tracks a StepLog). Not while a buffer of it is out. */
static void
steplog_fit(StepLog *self)
{
    if (self->exports > 0 || self->cap <= self->n || self->n == 0)
        return;
    uint64_t *v = PyMem_Realloc(self->v, (size_t)self->n * sizeof(uint64_t));
    if (v != NULL) { /* else it keeps its room: no harm */
        self->v = v;
        self->cap = self->n;
    }
}

static PyObject *
StepLog_fit(StepLog *self, PyObject *Py_UNUSED(ignored))
{
    steplog_fit(self);
    return Py_NewRef((PyObject *)self);
}

static PyObject *
StepLog_sizeof(StepLog *self, PyObject *Py_UNUSED(ignored))
{
    return PyLong_FromSsize_t((Py_ssize_t)sizeof(StepLog) + self->cap * (Py_ssize_t)sizeof(uint64_t));
}

static PyObject *
StepLog_repr(StepLog *self)
{
    return PyUnicode_FromFormat("<StepLog of %zd times>", self->n);
}

static PyMethodDef StepLog_methods[] = {
    {"append", (PyCFunction)StepLog_append, METH_O, "Append a perf_counter_ns() time."},
    {"fit", (PyCFunction)StepLog_fit, METH_NOARGS,
     "Cut its room to its times (a finished task's record holds it); returns it."},
    {"__sizeof__", (PyCFunction)StepLog_sizeof, METH_NOARGS, "Its size in memory, in bytes, its times' room included."},
    {NULL},
};

static PySequenceMethods StepLog_as_sequence = {
    .sq_length = (lenfunc)StepLog_len,
    .sq_item = (ssizeargfunc)StepLog_item,
};

static PyBufferProcs StepLog_as_buffer = {
    .bf_getbuffer = (getbufferproc)StepLog_getbuffer,
    .bf_releasebuffer = (releasebufferproc)StepLog_releasebuffer,
};

static PyTypeObject StepLogType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "aprof._ctracer.StepLog",
    .tp_basicsize = sizeof(StepLog),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "StepLog()\n--\n\nA task's step times (start, end, ...) as unsigned 64-bit ints; "
              "exports a buffer of them (format 'Q').",
    .tp_new = PyType_GenericNew,
    .tp_dealloc = (destructor)StepLog_dealloc,
    .tp_repr = (reprfunc)StepLog_repr,
    .tp_methods = StepLog_methods,
    .tp_as_sequence = &StepLog_as_sequence,
    .tp_as_buffer = &StepLog_as_buffer,
};

/* ------------------------------------------------------------------------ */
/* TaskRecord                                                                 */
/* ------------------------------------------------------------------------ */

/* A finished task's record: the 14 fields of TASK_RECORD_FIELDS
 * (aprof/_integrations/_tasks.py), read as a sequence. It is a tuple's
 * layout without the tuple's collector header: the record holds strings,
 * ints, None, the step log, the wait runs (lists of strings and ints) and
 * the spawn site, none of which can refer back to it, so it can be in no
 * reference cycle and is not a GC container. A server records a task per
 * request and keeps its record in the ring: as a tuple, each one counted
 * towards the collector's next young collection (allocations less
 * deallocations), which then came several times as often as without aprof
 * (issue 19); a TaskRecord is not counted, and is 24 bytes smaller. */
PyTypeObject TaskRecordType;

/* A new record of the n = TASK_RECORD_LEN fields f (references taken), or
 * NULL with an exception. */
PyObject *
aprof_task_record(PyObject *const *f)
{
    TaskRecord *r = PyObject_New(TaskRecord, &TaskRecordType);
    if (r == NULL)
        return NULL;
    for (int k = 0; k < TASK_RECORD_LEN; k++)
        r->f[k] = Py_NewRef(f[k]);
    return (PyObject *)r;
}

static PyObject *
TaskRecord_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    if ((kwds != NULL && PyDict_GET_SIZE(kwds) > 0) || PyTuple_GET_SIZE(args) != TASK_RECORD_LEN) {
        PyErr_Format(PyExc_TypeError, "TaskRecord() takes the %d fields of TASK_RECORD_FIELDS, positionally",
                     TASK_RECORD_LEN);
        return NULL;
    }
    return aprof_task_record(&PyTuple_GET_ITEM(args, 0));
}

static void
TaskRecord_dealloc(TaskRecord *self)
{
    for (int k = 0; k < TASK_RECORD_LEN; k++)
        Py_XDECREF(self->f[k]);
    PyObject_Free(self);
}

static Py_ssize_t
TaskRecord_len(TaskRecord *self)
{
    return TASK_RECORD_LEN;
}

static PyObject *
TaskRecord_item(TaskRecord *self, Py_ssize_t i)
{
    if (i < 0 || i >= TASK_RECORD_LEN) {
        PyErr_SetString(PyExc_IndexError, "TaskRecord index out of range");
        return NULL;
    }
    return Py_NewRef(self->f[i]);
}

static PyObject *
TaskRecord_repr(TaskRecord *self)
{
    PyObject *t = PyTuple_New(TASK_RECORD_LEN);
    if (t == NULL)
        return NULL;
    for (int k = 0; k < TASK_RECORD_LEN; k++)
        PyTuple_SET_ITEM(t, k, Py_NewRef(self->f[k]));
    PyObject *r = PyUnicode_FromFormat("TaskRecord%R", t);
    Py_DECREF(t);
    return r;
}

static PyObject *
TaskRecord_richcompare(PyObject *a, PyObject *b, int op)
{
    /* as the tuple of its fields compares (with another record, or a tuple) */
    PyObject *ta = PySequence_Tuple(a), *tb = ta != NULL ? PySequence_Tuple(b) : NULL;
    PyObject *r = tb != NULL ? PyObject_RichCompare(ta, tb, op) : NULL;
    Py_XDECREF(ta);
    Py_XDECREF(tb);
    return r;
}

static PySequenceMethods TaskRecord_as_sequence = {
    .sq_length = (lenfunc)TaskRecord_len,
    .sq_item = (ssizeargfunc)TaskRecord_item,
};

PyTypeObject TaskRecordType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "aprof._ctracer.TaskRecord",
    .tp_basicsize = sizeof(TaskRecord),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "TaskRecord(*fields)\n--\n\nA finished task's record: the fields of TASK_RECORD_FIELDS, read as a "
              "sequence (not a GC container: it holds plain data).",
    .tp_new = TaskRecord_new,
    .tp_dealloc = (destructor)TaskRecord_dealloc,
    .tp_repr = (reprfunc)TaskRecord_repr,
    .tp_richcompare = TaskRecord_richcompare,
    .tp_hash = PyObject_HashNotImplemented,
    .tp_as_sequence = &TaskRecord_as_sequence,
};

/* ------------------------------------------------------------------------ */
/* Which task a callback steps, and whether aprof records it                  */
/* ------------------------------------------------------------------------ */

/* The task whose step or wakeup `cb` is (borrowed), or NULL (no exception):
 *   - the C Task's step: a TaskStepMethWrapper, whose __self__ is the task;
 *   - the C Task's wakeup: the builtin method task_wakeup bound to the task;
 *   - the Python Task's (asyncio.tasks._PyTask) __step and __wakeup. */
static PyObject *
task_of(PyObject *cb, int *is_step)
{
    PyTypeObject *tp = Py_TYPE(cb);
    if (tp == &PyCFunction_Type || tp == &PyCMethod_Type) {
        PyObject *self = PyCFunction_GET_SELF(cb);
        PyMethodDef *def = ((PyCFunctionObject *)cb)->m_ml;
        if (self == NULL || !PyObject_TypeCheck(self, (PyTypeObject *)c_task_type))
            return NULL;
        if (def != wakeup_def) {
            if (wakeup_def != NULL || strcmp(def->ml_name, "task_wakeup") != 0)
                return NULL;
            wakeup_def = def;
        }
        *is_step = 0;
        return self;
    }
    if (tp == &PyMethod_Type) {
        PyObject *fn = PyMethod_GET_FUNCTION(cb);
        if (fn != py_step_fn && fn != py_wakeup_fn)
            return NULL;
        *is_step = fn == py_step_fn;
        return PyMethod_GET_SELF(cb);
    }
    if (tp != step_meth_wrapper_type) {
        /* "TaskStepMethWrapper" (3.11) or "_asyncio.TaskStepMethWrapper". */
        const char *dot = strrchr(tp->tp_name, '.');
        if (step_meth_wrapper_type != NULL || strcmp(dot != NULL ? dot + 1 : tp->tp_name, "TaskStepMethWrapper") != 0)
            return NULL;
        step_meth_wrapper_type = tp;
    }
    /* Its __self__ (a getset) is the task; held by the wrapper, so borrowed
     * for as long as the caller holds `cb`. The wrapper's first field is
     * that task (_asynciomodule.c: TaskStepMethWrapper { PyObject_HEAD;
     * TaskObj *sw_task; PyObject *sw_arg; }, 3.11-3.13): read there once
     * the first wrapper seen proved it, else through __self__. */
    PyObject *self;
    if (APROF_LIKELY(step_wrapper_layout > 0)) {
        self = ((step_wrapper_view *)cb)->sw_task;
    }
    else {
        self = PyObject_GetAttr(cb, str_self);
        if (self == NULL) {
            PyErr_Clear();
            return NULL;
        }
        Py_DECREF(self);
        if (step_wrapper_layout == 0)
            step_wrapper_layout = ((step_wrapper_view *)cb)->sw_task == self ? 1 : -1;
    }
    if (self == NULL || !PyObject_TypeCheck(self, (PyTypeObject *)c_task_type))
        return NULL;
    *is_step = 1;
    return self;
}

static inline PyObject *
slot_at(PyObject *obj, Py_ssize_t offset)
{
    return *(PyObject **)((char *)obj + offset);
}

int
aprof_task_owner(PyObject *lt, int64_t *id, PyObject **name, PyObject **kind, PyObject **os_tid, PyObject ***block)
{
    if (task_thread_type == NULL || !Py_IS_TYPE(lt, task_thread_type))
        return 0;
    *block = (PyObject **)((char *)lt + off_tt[TT_BLOCK]);
    PyObject *i = slot_at(lt, off_tt[TT_ID]);
    *name = slot_at(lt, off_tt[TT_NAME]);
    *kind = slot_at(lt, off_tt[TT_KIND]);
    *os_tid = slot_at(lt, off_tt[TT_OS_TID]);
    if (i == NULL || !PyLong_CheckExact(i) || *name == NULL || !PyUnicode_CheckExact(*name) || *kind == NULL ||
        !PyUnicode_CheckExact(*kind) || *os_tid == NULL || !PyLong_CheckExact(*os_tid))
        return 0;
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(i, &overflow);
    if (v <= 0 || overflow) {
        PyErr_Clear();
        return 0;
    }
    *id = v;
    return 1;
}

/* The TaskThread of a task a running profile records (new reference), or
 * NULL (no exception). `*has_lt` says whether the task carries aprof's
 * attribute at all: a logical thread, or None for "seen, not recorded". */
static PyObject *
recorded(PyObject *task, int *has_lt)
{
    PyObject *lt;
    *has_lt = 0;
    if (task_attr(task, &lt) < 0) {
        PyErr_Clear();
        return NULL;
    }
    if (lt == NULL)
        return NULL;
    *has_lt = 1;
    if (Py_IS_TYPE(lt, task_thread_type)) {
        PyObject *state = slot_at(lt, off_tt[TT_STATE]);
        if (state != NULL && state != Py_None && slot_at(lt, off_tt[TT_STEPS]) != NULL)
            return lt;
    }
    Py_DECREF(lt);
    return NULL;
}

/* ------------------------------------------------------------------------ */
/* StepCall                                                                   */
/* ------------------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    PyObject *cb;   /* the step or wakeup */
    PyObject *task;
    PyObject *tt;   /* the task's TaskThread */
    uint64_t ready; /* when the loop was asked to run it: the task's wait ended */
    vectorcallfunc vectorcall;
} StepCall;

static PyTypeObject StepCallType;
static Py_ssize_t member_offset(PyObject *cls, const char *name);

/* The offsets of class `cls`'s slots `names` into `out` (all or none). */
static int
member_offsets(PyObject *cls, const char *const *names, int n, Py_ssize_t *out)
{
    Py_ssize_t tmp[32];
    if (n > 32) {
        PyErr_SetString(PyExc_SystemError, "member_offsets: too many slots");
        return -1;
    }
    for (int i = 0; i < n; i++)
        if ((tmp[i] = member_offset(cls, names[i])) < 0)
            return -1;
    memcpy(out, tmp, (size_t)n * sizeof *out);
    return 0;
}

/* The step is over: if the task finished in it, close its record. */
/* task.done(): for the C Task itself through its method descriptor, found
 * once (a subclass may override done(): asked by name). */
static PyObject *c_task_done;

/* descr(self) for the method descriptor of a C method that takes no
 * argument (the C Task's done(), cancelled()): its C function called
 * directly, as the descriptor's vectorcall does after its checks (self
 * is of its class: the callers check), else through the call. */
static inline PyObject *
call_noargs(PyObject *descr, PyObject *self)
{
    if (APROF_LIKELY(Py_IS_TYPE(descr, &PyMethodDescr_Type))) {
        PyMethodDef *def = ((PyMethodDescrObject *)descr)->d_method;
        if ((def->ml_flags & ~(METH_COEXIST)) == METH_NOARGS)
            return def->ml_meth(self, NULL);
    }
    return PyObject_Vectorcall(descr, &self, 1, NULL);
}

/* obj.<name> for the getset descriptor `descr` of obj's class (the C
 * Future's `_exception`, `_callbacks`; a coroutine's `cr_await`, a
 * generator's `gi_yieldfrom`): its C getter called directly (obj is of its
 * class: the callers check), else through getattr. New reference, or NULL
 * with an exception. */
static inline PyObject *
getset_get(PyObject *descr, PyObject *obj, PyObject *name)
{
    if (APROF_LIKELY(descr != NULL && Py_IS_TYPE(descr, &PyGetSetDescr_Type))) {
        PyGetSetDef *gs = ((PyGetSetDescrObject *)descr)->d_getset;
        if (gs->get != NULL)
            return gs->get(obj, gs->closure);
    }
    return PyObject_GetAttr(obj, name);
}

static inline PyObject *
task_done(PyObject *task)
{
    if (APROF_LIKELY(Py_TYPE(task) == (PyTypeObject *)c_task_type) && c_task_done != NULL)
        return call_noargs(c_task_done, task);
    return PyObject_VectorcallMethod(str_done, &task, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
}

/* ------------------------------------------------------------------------ */
/* A task's end in C: _asyncio._task_done and TaskThread.finished (their     */
/* twins), for the common case: a C Task recorded by one profile             */
/* ------------------------------------------------------------------------ */

static int finish_ready = 0;
static PyObject *no_records, *discard_steps;
static PyObject *c_task_get_name, *c_task_cancelled, *c_task_get_coro;
static PyObject *c_task_exception; /* the C Task's `_exception` getset descriptor (or NULL) */
static PyObject *c_future_callbacks; /* the C Future's `_callbacks` (or NULL) */
#if PY_VERSION_HEX >= 0x030C0000
static PyObject *c_task_get_loop, *c_task_get_context; /* (eager first steps) */
#endif
static PyObject *str_lists;

/* Set up further down (_states_setup, _waits_setup), read by a task's end
 * too: a ProfilerState's slots, by offset. */
enum { SI_ENABLED, SI_RECORDER, SI_STATE, SI_TASKS, SI_RUNNING, SI_BUDGET, SI_TASK_RECORDS, SI_LISTS, SI_COUNT };
static int states_ready = 0;
static Py_ssize_t off_si[SI_COUNT];
static PyObject *cr_state_type; /* ProfilerState (set up with _task_create_setup) */
static int waits_ready = 0;
static PyTypeObject WaitLogType; /* the C WaitLog (below) */
static PyObject *str_exception, *str_runs, *str_returned, *str_cancelled, *str_cancelled_error,
    *str_task_fallback;

static inline void
set_slot(PyObject *obj, Py_ssize_t offset, PyObject *value)
{
    PyObject **p = (PyObject **)((char *)obj + offset);
    PyObject *old = *p;
    *p = Py_NewRef(value);
    Py_XDECREF(old);
}

/* ------------------------------------------------------------------------ */
/* The C Task's waiter, coroutine and name, read in place                    */
/* ------------------------------------------------------------------------ */

/* asyncio's C Task keeps the future it waits on, its coroutine and its
 * name in three consecutive object fields (task_fut_waiter, task_coro and
 * task_name in CPython's Modules/_asynciomodule.c, 3.11 to 3.14), read
 * through the `_fut_waiter` property, get_coro() and get_name(): a lookup
 * or a method call each, a few times a task. And from 3.12 a task's name is
 * made lazily: the field holds the counter's int until get_name() first
 * formats "Task-<n>" from it (PyUnicode_FromFormat: ~2,000 instructions),
 * which aprof then did at every task's creation, where a server that never
 * asks pays nothing. Read in place, such a name is written out here
 * (counter_name) and the task's field left as it is.
 *
 * The fields' place is learnt from the first C Task aprof records
 * (task_layout_see: its coroutine's pointer found once in the object, the
 * name get_name() returned right after it, the waiter unset before it),
 * and trusted once the next TASK_LAYOUT_CHECKS tasks read the same both
 * ways (the waiter: once as many waits did); until then, and for good if
 * any disagrees, the methods and the property answer. */
#define TASK_LAYOUT_CHECKS 8
static Py_ssize_t task_off_coro;          /* the coroutine's offset; 0: not learnt */
#if PY_VERSION_HEX >= 0x030C0000
/* (eager first steps, 3.12+: the task's loop, and its context, the field
 * after its name, checked alike) */
static Py_ssize_t task_off_loop;
#endif
static int task_checks_left = TASK_LAYOUT_CHECKS, task_waiter_checks_left = TASK_LAYOUT_CHECKS;
static int task_layout_bad;               /* a check disagreed: the methods, for good */
static PyObject *str_fut_waiter;          /* "_fut_waiter" (interned in _tasks_setup) */

static int task_fields_ok; /* learnt, checked, and no check disagreed */

static inline int
task_layout_trusted(PyObject *task)
{
    return task_fields_ok && Py_IS_TYPE(task, (PyTypeObject *)c_task_type);
}

static inline PyObject *
task_field(PyObject *task, int k) /* -1 waiter, 0 coroutine, 1 name, 2 context (borrowed, may be NULL) */
{
    return ((PyObject **)((char *)task + task_off_coro))[k];
}

/* "Task-<n>" for the counter int n, as get_name() formats it (new
 * reference), or NULL without an exception when n is not a counter's int. */
static PyObject *
counter_name(PyObject *n)
{
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(n, &overflow);
    if (v < 0 || overflow) {
        PyErr_Clear();
        return NULL;
    }
    static const char pairs[201] = "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
                                   "40414243444546474849505152535455565758596061626364656667686970717273747576777879"
                                   "8081828384858687888990919293949596979899";
    char digits[24];
    int k = 24; /* written from the end */
    while (v >= 100) {
        int two = (int)(v % 100);
        v /= 100;
        digits[--k] = pairs[2 * two + 1];
        digits[--k] = pairs[2 * two];
    }
    if (v >= 10) {
        digits[--k] = pairs[2 * v + 1];
        digits[--k] = pairs[2 * v];
    }
    else
        digits[--k] = (char)('0' + v);
    PyObject *r = PyUnicode_New(5 + (24 - k), 127);
    if (r == NULL) {
        PyErr_Clear();
        return NULL;
    }
    Py_UCS1 *d = PyUnicode_1BYTE_DATA(r);
    memcpy(d, "Task-", 5);
    memcpy(d + 5, digits + k, (size_t)(24 - k));
    return r;
}

/* The names written out last, by their counter's int: a task's name is
 * read at its creation, at its end and where another task waits on it. An
 * entry holds its int, so no other int takes its address meanwhile. */
#define NAME_MEMO_SIZE 64 /* a power of two */
static struct {
    PyObject *counter, *name;
} name_memo[NAME_MEMO_SIZE];

/* A C Task's name read in place, as get_name() says it (new reference), or
 * NULL without an exception: ask get_name(). */
static PyObject *
task_name_in_place(PyObject *task)
{
    PyObject *n = task_field(task, 1);
    if (n == NULL)
        return NULL;
    if (PyUnicode_CheckExact(n))
        return Py_NewRef(n);
    if (!PyLong_CheckExact(n))
        return NULL;
    size_t h = hash_ptr(n, NAME_MEMO_SIZE - 1);
    if (name_memo[h].counter == n)
        return Py_NewRef(name_memo[h].name);
    PyObject *name = counter_name(n);
    if (name != NULL) {
        Py_XSETREF(name_memo[h].counter, Py_NewRef(n));
        Py_XSETREF(name_memo[h].name, Py_NewRef(name));
    }
    return name;
}

/* task.get_coro() (new reference), or NULL with an exception. */
static inline PyObject *
task_get_coro(PyObject *task)
{
    if (APROF_LIKELY(task_layout_trusted(task))) {
        PyObject *coro = task_field(task, 0);
        if (coro != NULL)
            return Py_NewRef(coro);
    }
    return PyObject_Vectorcall(c_task_get_coro, &task, 1, NULL);
}

/* The task's name now (it may have been renamed): _asyncio._name_of. */
static PyObject *
finish_name(PyObject *task)
{
    if (APROF_LIKELY(task_layout_trusted(task))) {
        PyObject *name = task_name_in_place(task);
        if (name != NULL)
            return name;
    }
    PyObject *name = PyObject_Vectorcall(c_task_get_name, &task, 1, NULL);
    if (name != NULL && !PyUnicode_CheckExact(name))
        Py_SETREF(name, PyObject_Str(name));
    if (name == NULL) { /* a task subclass with an odd name */
        PyErr_Clear();
        name = Py_NewRef(str_task_fallback);
    }
    return name;
}

/* getattr(task, "_fut_waiter") as optional_attr says it. */
static int
task_fut_waiter(PyObject *task, PyObject **out)
{
    if (APROF_LIKELY(task_waiter_checks_left == 0 && task_layout_trusted(task))) {
        PyObject *w = task_field(task, -1);
        *out = Py_NewRef(w != NULL ? w : Py_None);
        return 1;
    }
    int r = optional_attr(task, str_fut_waiter, out);
    if (r > 0 && task_off_coro > 0 && task_waiter_checks_left > 0 && !task_layout_bad &&
        Py_IS_TYPE(task, (PyTypeObject *)c_task_type)) {
        PyObject *w = task_field(task, -1);
        if ((w != NULL ? w : Py_None) == *out)
            task_waiter_checks_left--;
        else {
            task_layout_bad = 1;
            task_fields_ok = 0;
        }
    }
    return r;
}

/* _task_layout() -> (coroutine's offset, name checks left, waiter checks
 * left, disagreed): what task_layout_see learnt (the tests read it). */
static PyObject *
task_layout_view(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(ignored))
{
    return Py_BuildValue("(niiO)", task_off_coro, task_checks_left, task_waiter_checks_left,
                         task_layout_bad ? Py_True : Py_False);
}

/* A new C Task's coroutine and name (from get_coro() and get_name(), just
 * asked) where the fields are not trusted yet: learn their place from the
 * first, then check it against the next ones. */
static void
task_layout_see(PyObject *task, PyObject *coro, PyObject *name)
{
    if (task_layout_bad || task_checks_left == 0 || !Py_IS_TYPE(task, (PyTypeObject *)c_task_type) ||
        !PyUnicode_CheckExact(name))
        return;
    PyObject **p = (PyObject **)task;
#if PY_VERSION_HEX >= 0x030C0000
    PyObject *loop = PyObject_Vectorcall(c_task_get_loop, &task, 1, NULL);
    PyObject *ctx = loop != NULL ? PyObject_Vectorcall(c_task_get_context, &task, 1, NULL) : NULL;
    if (ctx == NULL) {
        PyErr_Clear();
        Py_XDECREF(loop);
        return; /* not this time */
    }
#endif
    if (task_off_coro == 0) {
        Py_ssize_t n = Py_TYPE(task)->tp_basicsize / (Py_ssize_t)sizeof(PyObject *), found = 0;
        Py_ssize_t first = (Py_ssize_t)(sizeof(PyObject) / sizeof(PyObject *));
        for (Py_ssize_t k = first + 1; k + 2 < n; k++) {
            if (p[k] != coro)
                continue;
            if (found != 0 || p[k + 1] != name || p[k - 1] != NULL) {
                found = -1; /* twice, or not as the fields sit */
                break;
            }
            found = k;
        }
#if PY_VERSION_HEX >= 0x030C0000
        Py_ssize_t at_loop = 0;
        for (Py_ssize_t k = first; found > 0 && k < found; k++) {
            if (p[k] == loop)
                at_loop = at_loop == 0 ? k : -1;
        }
        if (found > 0 && (at_loop <= 0 || p[found + 2] != ctx))
            found = -1;
        if (found > 0)
            task_off_loop = at_loop * (Py_ssize_t)sizeof(PyObject *);
        Py_DECREF(loop);
        Py_DECREF(ctx);
#endif
        if (found <= 0)
            task_layout_bad = 1;
        else
            task_off_coro = found * (Py_ssize_t)sizeof(PyObject *);
        return;
    }
    PyObject *mine = task_field(task, 0) == coro ? task_name_in_place(task) : NULL;
    int same = mine != NULL && PyUnicode_Compare(mine, name) == 0;
#if PY_VERSION_HEX >= 0x030C0000
    same = same && task_field(task, 2) == ctx && *(PyObject **)((char *)task + task_off_loop) == loop;
    Py_DECREF(loop);
    Py_DECREF(ctx);
#endif
    if (same)
        task_checks_left--;
    else
        task_layout_bad = 1;
    task_fields_ok = task_checks_left == 0 && !task_layout_bad;
    if (PyErr_Occurred())
        PyErr_Clear();
    Py_XDECREF(mine);
}

/* Take o off the cyclic GC's lists if it is plain data
 * (aprof_untrack_if_acyclic), the two empty constants a finished
 * TaskThread points at, which never hold anything, aside. */
static void
untrack_plain(PyObject *o)
{
    PyObject *consts[2] = {no_records, discard_steps};
    aprof_untrack_if_acyclic(o, consts, 2);
}

/* untrack_plain(tt) for an exact TaskThread, its slots read in place
 * (they are all its references: __slots__, no __dict__, its type aside). */
static void
untrack_tt(PyObject *tt)
{
    if (!Py_IS_TYPE(tt, task_thread_type) || !PyObject_GC_IsTracked(tt))
        return;
    for (int i = 0; i < TT_COUNT; i++) {
        PyObject *v = slot_at(tt, off_tt[i]);
        if (v != NULL && v != no_records && v != discard_steps && PyObject_IS_GC(v) && PyObject_GC_IsTracked(v)) {
            untrack_plain(tt); /* the general walk says */
            return;
        }
    }
    PyObject_GC_UnTrack(tt);
}

/* A task just finished and its record is written: take what it leaves in
 * the profile off the cyclic GC's lists, now rather than when a ring seals
 * its generation (ring_seal, ring_records) or never (an unbounded
 * profile). A server records a task per request: each left its record,
 * its steps, its raw list and its TaskThread on the GC's lists, the
 * survivors of the young collections that set off full collections of the
 * program's heap, each walking all of them (issue 19: a tenth of what the
 * always-on profile cost a request, and the pauses in its p99). All of it
 * is plain data by now: the record (a TaskRecord, never on those lists)
 * holds strings, ints, None, the steps array and the wait runs (lists of
 * strings and ints); the TaskThread
 * holds no profile any more (only strings, ints, None, its spawn site and
 * the two empty constants); its raw list holds blocks and tuples that
 * never refer back to a list (later, only the end of a range it started
 * can be added, a tuple of ints). Whatever is not plain stays tracked. */
static void
untrack_finished(PyObject *tt, PyObject *state, PyObject *exact, PyObject *runs)
{
    untrack_plain(exact);
    if (runs != NULL && PyList_CheckExact(runs)) {
        for (Py_ssize_t k = 0; k < PyList_GET_SIZE(runs); k++)
            untrack_plain(PyList_GET_ITEM(runs, k));
        untrack_plain(runs);
    }
    untrack_plain(slot_at(tt, off_tt[TT_SITE]));
    PyObject *lists = states_ready && Py_IS_TYPE(state, (PyTypeObject *)cr_state_type)
                          ? Py_XNewRef(slot_at(state, off_si[SI_LISTS]))
                          : PyObject_GetAttr(state, str_lists);
    if (lists == NULL) {
        PyErr_Clear();
        return;
    }
    if (PyDict_CheckExact(lists)) {
        /* A raw list of its own (ranges with a stack, instants: its plain
         * ranges are in TASK_BLOCKS) keeps the TaskThread as its key, past
         * its task; else the TaskThread dies with its task. */
        PyObject *lst = PyDict_GetItemWithError(lists, tt); /* borrowed */
        if (lst != NULL && PyList_CheckExact(lst)) {
            untrack_plain(lst);
            untrack_tt(tt);
        }
        else if (lst == NULL)
            PyErr_Clear();
    }
    Py_DECREF(lists);
}

/* Close the TASK record of `tt` (exact TaskThread, recorded by one
 * profile) of `task` (exact C Task), done: 1 if done here, 0 if the
 * Python twin must do it (nothing changed yet), -1 on error (nothing
 * changed either). */
static int
finish_in_c(PyObject *tt, PyObject *task)
{
    uint64_t end = now_ns();
    PyObject *state = slot_at(tt, off_tt[TT_STATE]);
    if (state == NULL || state == Py_None)
        return 1; /* no profile records it any more */
    for (int i = TT_ID; i <= TT_TASK_REF; i++) /* the record's slots, all set */
        if (slot_at(tt, off_tt[i]) == NULL)
            return 0;
    PyObject *steps = slot_at(tt, off_tt[TT_STEPS]);
    PyObject *records = slot_at(tt, off_tt[TT_RECORDS]);
    if (steps == NULL || !Py_IS_TYPE(steps, &StepLogType) || slot_at(tt, off_tt[TT_MORE]) != Py_None ||
        !PyList_CheckExact(records) || !PyLong_CheckExact(slot_at(tt, off_tt[TT_IDX])))
        return 0;
    PyObject *waits = slot_at(tt, off_tt[TT_WAITS]);
    PyObject *name = finish_name(task), *outcome = NULL, *exc_name = NULL, *runs = NULL, *exact = NULL, *rec = NULL;
    PyObject *cancelled = call_noargs(c_task_cancelled, task);
    if (cancelled == NULL)
        goto error;
    if (cancelled == Py_True) {
        outcome = Py_NewRef(str_cancelled);
        exc_name = Py_NewRef(str_cancelled_error);
    }
    else {
        /* not exception(): that marks it retrieved */
        PyObject *exc = getset_get(c_task_exception, task, str_exception);
        if (exc == NULL)
            goto error;
        if (exc == Py_None) {
            outcome = Py_NewRef(str_returned);
            exc_name = Py_NewRef(Py_None);
        }
        else {
            exc_name = PyType_GetName(Py_TYPE(exc)); /* type(exc).__name__ */
            outcome = exc_name != NULL ? PyUnicode_FromFormat("raised %U", exc_name) : NULL;
        }
        Py_DECREF(exc);
        if (outcome == NULL)
            goto error;
    }
    StepLog *log = (StepLog *)steps;
    if (log->n & 1) { /* finished mid-step (cancelled while running) */
        if (steplog_push(log, end) < 0)
            goto error;
    }
    /* the record holds the log itself, its room cut to its times */
    steplog_fit(log);
    exact = Py_NewRef(steps);
    if (waits != Py_None) {
        /* the C log itself (its runs read as lists when consolidated), or
         * the twin's list of runs */
        runs = Py_IS_TYPE(waits, &WaitLogType) ? Py_NewRef(waits) : PyObject_GetAttr(waits, str_runs);
        if (runs == NULL) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_AttributeError, "WaitLog.runs is not set");
            goto error;
        }
    }
    PyObject *end_o = PyLong_FromUnsignedLongLong(end);
    if (end_o == NULL)
        goto error;
    PyObject *fields[TASK_RECORD_LEN] = {
        slot_at(tt, off_tt[TT_ID]),  name, slot_at(tt, off_tt[TT_KIND]), slot_at(tt, off_tt[TT_OS_TID]),
        slot_at(tt, off_tt[TT_CORO]), slot_at(tt, off_tt[TT_SPAWN_NS]), slot_at(tt, off_tt[TT_SEQ]),
        slot_at(tt, off_tt[TT_FWD]), end_o, outcome, exc_name, exact, runs != NULL ? runs : Py_None,
        slot_at(tt, off_tt[TT_SITE])};
    rec = aprof_task_record(fields);
    Py_DECREF(end_o);
    if (rec == NULL)
        goto error;
    /* Nothing fails from here. _put: after stop nobody reads the list, and
     * a bounded profile empties the list of a generation it lets go. */
    Py_ssize_t idx = PyLong_AsSsize_t(slot_at(tt, off_tt[TT_IDX]));
    if (idx >= 0 && idx < PyList_GET_SIZE(records) && PyList_GET_ITEM(records, idx) == tt) {
        PyObject *old = PyList_GET_ITEM(records, idx);
        PyList_SET_ITEM(records, idx, Py_NewRef(rec));
        Py_DECREF(old);
    }
    if (idx == -1 && PyErr_Occurred())
        PyErr_Clear(); /* an idx out of Py_ssize_t's range: nothing put */
    Py_INCREF(state); /* for untrack_finished: the slot lets it go */
    set_slot(tt, off_tt[TT_NAME], name);
    set_slot(tt, off_tt[TT_STATE], Py_None);
    set_slot(tt, off_tt[TT_RECORDS], no_records);
    set_slot(tt, off_tt[TT_STEPS], discard_steps);
    set_slot(tt, off_tt[TT_WAITS], Py_None);
    set_slot(tt, off_tt[TT_TASK_REF], Py_None); /* named for good */
    if (slot_at(tt, off_tt[TT_BLOCK]) != NULL)
        set_slot(tt, off_tt[TT_BLOCK], Py_None);
    untrack_finished(tt, state, exact, runs);
    Py_DECREF(state);
    Py_DECREF(name);
    Py_DECREF(cancelled);
    Py_DECREF(outcome);
    Py_DECREF(exc_name);
    Py_XDECREF(runs);
    Py_DECREF(exact);
    Py_DECREF(rec);
    return 1;
error:
    Py_XDECREF(name);
    Py_XDECREF(cancelled);
    Py_XDECREF(outcome);
    Py_XDECREF(exc_name);
    Py_XDECREF(runs);
    Py_XDECREF(exact);
    return -1;
}

static int
after_step(StepCall *self)
{
    PyObject *task = self->task;
    PyObject *done = task_done(task);
    if (done == NULL)
        return -1;
    int is_done = done == Py_True;
    Py_DECREF(done);
    if (!is_done)
        return 0;
    PyObject *tt = self->tt;
    if (finish_ready && Py_IS_TYPE(tt, task_thread_type) && Py_IS_TYPE(task, (PyTypeObject *)c_task_type)) {
        int rc = finish_in_c(tt, task);
        if (rc != 0)
            return rc < 0 ? -1 : 0;
    }
    PyObject *r = PyObject_CallFunctionObjArgs(on_task_done, tt, task, NULL);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

/* _task_finish_setup(NO_RECORDS, DISCARD_STEPS) after
 * _tasks_setup: a C Task's end is then recorded here; None: by the Python
 * twin (_asyncio._task_done), as before. */
static PyObject *
task_finish_setup(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs == 1 && args[0] == Py_None) {
        finish_ready = 0;
        Py_RETURN_NONE;
    }
    if (nargs != 2 || task_thread_type == NULL || c_task_type == NULL) {
        PyErr_SetString(PyExc_TypeError,
                        "_task_finish_setup(NO_RECORDS, DISCARD_STEPS) after _tasks_setup, or _task_finish_setup(None)");
        return NULL;
    }
    Py_XSETREF(c_task_get_name, PyObject_GetAttrString(c_task_type, "get_name"));
    Py_XSETREF(c_task_cancelled, PyObject_GetAttrString(c_task_type, "cancelled"));
    Py_XSETREF(c_task_exception, _PyType_Lookup((PyTypeObject *)c_task_type, str_exception));
    Py_XINCREF(c_task_exception);
    if (c_task_get_name == NULL || c_task_cancelled == NULL)
        return NULL;
    Py_XSETREF(no_records, Py_NewRef(args[0]));
    Py_XSETREF(discard_steps, Py_NewRef(args[1]));
    finish_ready = 1;
    Py_RETURN_NONE;
}

static int note_wait_c(PyObject *tt, PyObject *task, uint64_t start, uint64_t end);

/* Describe a long wait: in C for a C Task at a call site already seen,
 * else note_wait(tt, task, start, end), which reports its own failures. */
static void
note_long_wait(PyObject *tt, PyObject *task, uint64_t start, uint64_t end)
{
    int done = note_wait_c(tt, task, start, end);
    if (done != 0) {
        if (done < 0)
            report_unraisable("await chain");
        return;
    }
    PyObject *args[4] = {tt, task, PyLong_FromUnsignedLongLong(start), PyLong_FromUnsignedLongLong(end)};
    PyObject *r = NULL;
    if (args[2] != NULL && args[3] != NULL)
        r = PyObject_Vectorcall(on_long_wait, args, 4, NULL);
    if (r == NULL)
        report_unraisable("await chain");
    Py_XDECREF(r);
    Py_XDECREF(args[2]);
    Py_XDECREF(args[3]);
}

static PyObject *
StepCall_vectorcall(StepCall *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    PyObject *tt = self->tt;
    PyObject *steps = slot_at(tt, off_tt[TT_STEPS]);
    if (steps == NULL)
        return PyObject_Vectorcall(self->cb, args, nargsf, kwnames);
    Py_INCREF(steps);
    if (APROF_UNLIKELY(PyList_GET_SIZE(tracer_running) > 0) && PyObject_Length(steps) == 0) {
        /* The first step, in the task's own context, while the Python
         * tracer runs: tell it which task this context is. */
        PyObject *r = PyObject_CallOneArg(on_first_step, tt);
        if (r == NULL)
            report_unraisable("first step");
        Py_XDECREF(r);
    }
    PyObject *prev_lt = aprof_stepping_lt, *prev_ctx = aprof_stepping_ctx;
    aprof_stepping_lt = Py_NewRef(tt);
    aprof_stepping_ctx = PyThreadState_Get()->context;
    uint64_t start = now_ns();
    if (APROF_LIKELY(Py_IS_TYPE(steps, &StepLogType))) {
        StepLog *log = (StepLog *)steps;
        uint64_t last_end = log->n >= 2 && (log->n & 1) == 0 ? log->v[log->n - 1] : self->ready;
        if (self->ready > last_end && self->ready - last_end >= long_wait_ns) {
            /* A long wait ended when the step was scheduled (the time it
             * then sat in the loop's queue is the loop's, not the wait's):
             * say what it was on, while the coroutine still waits there. */
            note_long_wait(tt, self->task, last_end, self->ready);
            start = now_ns();
        }
    }
    if (steps_push(steps, start) < 0)
        report_unraisable("step start");
    PyObject *result = PyObject_Vectorcall(self->cb, args, nargsf, kwnames);
    uint64_t end = now_ns();
    /* An exception is set only if the step failed (the callback returned
     * NULL): kept aside while aprof's own work runs. */
    saved_exc exc = {0};
    if (APROF_UNLIKELY(result == NULL))
        SAVE_EXC(exc);
    if (steps_push(steps, end) < 0)
        report_unraisable("step end");
    Py_DECREF(steps);
    PyObject *mine = aprof_stepping_lt;
    aprof_stepping_lt = prev_lt;
    aprof_stepping_ctx = prev_ctx;
    Py_XDECREF(mine);
    if (after_step(self) < 0)
        report_unraisable("task end");
    if (APROF_UNLIKELY(result == NULL))
        RESTORE_EXC(exc);
    return result;
}

/* Freed wrappers, kept for the next step (as CPython keeps freed frames
 * and asyncio its future iterators): a step then costs no allocation and
 * adds nothing to the collector's count. The wrapper's fields are released
 * when the loop's handle lets go of it, after the step, exactly when the
 * callback it wraps would have been released (SPEC 15.6: a task that dies
 * then dies at the same moment, outside its context). Under the GIL. */
#define STEPCALL_FREELIST 256
static StepCall *stepcall_freelist[STEPCALL_FREELIST];
static int stepcall_numfree = 0;

/* A wrapper of `cb`, the step or wakeup of `task` (new reference). */
static PyObject *
StepCall_new_for(PyObject *cb, PyObject *task, PyObject *tt)
{
    StepCall *self;
    if (stepcall_numfree > 0) {
        self = stepcall_freelist[--stepcall_numfree];
        _Py_NewReference((PyObject *)self);
    }
    else if ((self = PyObject_GC_New(StepCall, &StepCallType)) == NULL) {
        return NULL;
    }
    self->cb = Py_NewRef(cb);
    self->task = Py_NewRef(task);
    self->tt = Py_NewRef(tt);
    self->ready = now_ns();
    self->vectorcall = (vectorcallfunc)StepCall_vectorcall;
    PyObject_GC_Track(self);
    return (PyObject *)self;
}

/* Everything but calling it reads as the wrapped callback: its attributes
 * (__self__, __qualname__, __class__, ...) and its repr. */
static PyObject *
StepCall_getattro(StepCall *self, PyObject *name)
{
    if (self->cb == NULL) /* cleared by the collector */
        return PyObject_GenericGetAttr((PyObject *)self, name);
    return PyObject_GetAttr(self->cb, name);
}

static PyObject *
StepCall_repr(StepCall *self)
{
    if (self->cb == NULL)
        return PyUnicode_FromString("<aprof task step>");
    return PyObject_Repr(self->cb);
}

static int
StepCall_traverse(StepCall *self, visitproc visit, void *arg)
{
    Py_VISIT(self->cb);
    Py_VISIT(self->task);
    Py_VISIT(self->tt);
    return 0;
}

static int
StepCall_clear(StepCall *self)
{
    Py_CLEAR(self->cb);
    Py_CLEAR(self->task);
    Py_CLEAR(self->tt);
    return 0;
}

static void
StepCall_dealloc(StepCall *self)
{
    PyObject_GC_UnTrack(self);
    StepCall_clear(self);
    if (Py_IS_TYPE(self, &StepCallType) && stepcall_numfree < STEPCALL_FREELIST)
        stepcall_freelist[stepcall_numfree++] = self;
    else
        PyObject_GC_Del(self);
}

static PyTypeObject StepCallType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "aprof._ctracer.StepCall",
    .tp_basicsize = sizeof(StepCall),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "A task's step or wakeup, timed (see aprof/_ctasks.c).",
    .tp_vectorcall_offset = offsetof(StepCall, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_getattro = (getattrofunc)StepCall_getattro,
    .tp_repr = (reprfunc)StepCall_repr,
    .tp_dealloc = (destructor)StepCall_dealloc,
    .tp_traverse = (traverseproc)StepCall_traverse,
    .tp_clear = (inquiry)StepCall_clear,
};

/* ------------------------------------------------------------------------ */
/* CallSoonHook                                                               */
/* ------------------------------------------------------------------------ */

/* The loop holds its hook (an instance attribute), so a hook holding the
 * loop's bound call_soon would make a cycle: a loop that dies by refcount
 * without aprof would then wait for the cyclic GC (SPEC 15.6; anyio's
 * test_asyncio_run_does_not_leak_event_loop). So, when the loop can be
 * weakly referenced (asyncio's loops), the hook holds call_soon's function
 * and a weak reference to the loop, and calls the function with the loop
 * prepended. Otherwise (uvloop's loops) it holds the bound call_soon. */
typedef struct {
    PyObject_HEAD
    PyObject *call_soon; /* the loop's own bound call_soon, or NULL */
    PyObject *func;      /* or: its function, */
    PyObject *loopref;   /* and a weak reference to the loop */
    vectorcallfunc vectorcall;
    PyObject *weakreflist;
} CallSoonHook;

#define SMALL_ARGS 8

/* The loop (new reference), or NULL with an exception set. */
static PyObject *
hook_loop_of(CallSoonHook *self)
{
    PyObject *loop;
#if PY_VERSION_HEX >= 0x030D0000
    if (PyWeakref_GetRef(self->loopref, &loop) < 0)
        return NULL;
#else
    loop = PyWeakref_GetObject(self->loopref);
    if (loop == NULL)
        return NULL;
    loop = loop == Py_None ? NULL : Py_NewRef(loop);
#endif
    if (loop == NULL)
        PyErr_SetString(PyExc_RuntimeError, "call_soon of an event loop that no longer exists");
    return loop;
}

/* The loop's own call_soon (bound; new reference). */
static PyObject *
hook_bound(CallSoonHook *self)
{
    if (self->call_soon != NULL)
        return Py_NewRef(self->call_soon);
    PyObject *loop = hook_loop_of(self);
    if (loop == NULL)
        return NULL;
    PyObject *bound = PyMethod_New(self->func, loop);
    Py_DECREF(loop);
    return bound;
}

/* Call the loop's own call_soon with `args` (which may have the
 * PY_VECTORCALL_ARGUMENTS_OFFSET slot before them). */
static PyObject *
hook_call_own(CallSoonHook *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    if (self->call_soon != NULL)
        return PyObject_Vectorcall(self->call_soon, args, nargsf, kwnames);
    PyObject *loop = hook_loop_of(self);
    if (loop == NULL)
        return NULL;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *result;
    if (nargsf & PY_VECTORCALL_ARGUMENTS_OFFSET) {
        PyObject **with = (PyObject **)args - 1, *saved = with[0];
        with[0] = loop;
        result = PyObject_Vectorcall(self->func, with, (size_t)(nargs + 1), kwnames);
        with[0] = saved;
    }
    else {
        Py_ssize_t total = nargs + (kwnames != NULL ? PyTuple_GET_SIZE(kwnames) : 0);
        PyObject *small[SMALL_ARGS + 1], **with = small;
        if (total + 1 > SMALL_ARGS + 1 && (with = PyMem_Malloc((size_t)(total + 1) * sizeof(PyObject *))) == NULL) {
            Py_DECREF(loop);
            return PyErr_NoMemory();
        }
        with[0] = loop;
        for (Py_ssize_t i = 0; i < total; i++)
            with[i + 1] = args[i];
        result = PyObject_Vectorcall(self->func, with, (size_t)(nargs + 1), kwnames);
        if (with != small)
            PyMem_Free(with);
    }
    Py_DECREF(loop);
    return result;
}

/* ------------------------------------------------------------------------ */
/* A task's creation in C: _asyncio._record and TaskThread.__init__ (their   */
/* twins), for the common case: a new C Task spawned inside a recorded       */
/* task's step, recorded by one profile                                      */
/* ------------------------------------------------------------------------ */

static int create_ready = 0;
static PyObject *cr_states_in, *cr_ids, *cr_seqs, *cr_user_site, *cr_site_cache, *cr_is_library,
    *cr_coro_qualname, *cr_budget_task;
static PyObject *str_asyncio, *str_qualname, *str_budget, *str_admit,
    *str_task_records, *str_run_coro, *str_get_coro;
static PyObject *last_qualname; /* the last coroutine name seen that names no wrapper */
static int cr_site_in_c;        /* cr_user_site is the extension's user_site: called without a call */
static PyObject *str_call_soon;
#define CREATE_FALLBACK Py_NotImplemented

/* _tasks.states_in(ctx) in C, for the common cases (set up by
 * _states_setup): the one profile that records a task spawned in `ctx`
 * (new reference), Py_None (none), or CREATE_FALLBACK (borrowed: several
 * profiles, or anything unusual: the twin's). */
static PyObject *si_var, *si_empty, *si_globals, *str_get;
static PyTypeObject *si_rfstate_type, *si_recorder_type;

static PyObject *
states_in_c(PyObject *ctx)
{
    if (!states_ready || !PyContext_CheckExact(ctx) || !PyList_CheckExact(si_globals))
        return CREATE_FALLBACK;
    PyObject *st;
    if (aprof_same_context_vars(ctx, PyThreadState_Get()->context)) {
        /* a new task's context, copied from the running one: the variable
         * as it reads here (cached by the variable), not ctx.get() */
        if (PyContextVar_Get(si_var, si_empty, &st) < 0)
            return NULL;
    }
    else {
        PyObject *args[3] = {ctx, si_var, si_empty};
        st = PyObject_VectorcallMethod(str_get, args, 3, NULL);
    }
    if (st == NULL)
        return NULL;
    PyObject *result = CREATE_FALLBACK;
    if (!Py_IS_TYPE(st, si_rfstate_type))
        goto out;
    PyObject *enabled = slot_at(st, off_si[SI_ENABLED]), *rec = slot_at(st, off_si[SI_RECORDER]);
    if (enabled == Py_False) {
        result = Py_None;
        goto out;
    }
    if (enabled != Py_True || rec == NULL)
        goto out;
    PyObject *found = NULL; /* borrowed */
    if (rec != Py_None) {
        if (!Py_IS_TYPE(rec, si_recorder_type))
            goto out;
        PyObject *ps = slot_at(rec, off_si[SI_STATE]);
        if (ps != NULL && ps != Py_None) {
            if (!Py_IS_TYPE(ps, (PyTypeObject *)cr_state_type))
                goto out;
            PyObject *tasks = slot_at(ps, off_si[SI_TASKS]), *running = slot_at(ps, off_si[SI_RUNNING]);
            if (tasks == NULL || running == NULL || !PyBool_Check(tasks) || !PyBool_Check(running))
                goto out; /* not what ProfilerState sets: the twin reads them as it will */
            if (tasks == Py_True && running == Py_True)
                found = ps;
        }
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(si_globals); i++) { /* a global profile's */
        PyObject *g = PyList_GET_ITEM(si_globals, i);
        if (g == rec)
            continue;
        if (!Py_IS_TYPE(g, si_recorder_type))
            goto out;
        PyObject *ps = slot_at(g, off_si[SI_STATE]);
        if (ps == NULL || ps == Py_None)
            continue;
        if (found != NULL || !Py_IS_TYPE(ps, (PyTypeObject *)cr_state_type))
            goto out; /* several profiles */
        found = ps;
    }
    result = found != NULL ? found : Py_None;
out:
    Py_DECREF(st);
    return result == CREATE_FALLBACK ? result : Py_NewRef(result);
}

/* next(it) of an iterator that never ends (itertools.count: the ids and
 * sequence numbers), new reference; NULL with an exception. */
static inline PyObject *
counter_next(PyObject *it)
{
    PyObject *v = Py_TYPE(it)->tp_iternext != NULL ? Py_TYPE(it)->tp_iternext(it) : NULL;
    if (v == NULL && !PyErr_Occurred())
        PyErr_SetString(PyExc_RuntimeError, "aprof: an id counter ended");
    return v;
}

/* A new C Task's TaskThread (new reference), Py_None (not recorded: the
 * task is marked seen), or CREATE_FALLBACK (borrowed: the Python twin
 * decides, nothing changed), or NULL with an exception. */
static PyObject *
create_in_c(PyObject *task, PyObject *ctx)
{
    PyObject *spawner = aprof_stepping_lt;
    if (spawner == NULL || !Py_IS_TYPE(spawner, task_thread_type) ||
        (aprof_stepping_ctx != NULL && aprof_stepping_ctx != PyThreadState_Get()->context))
        return CREATE_FALLBACK; /* not inside a recorded task's step: the twin checks for the loop's machinery */
    PyObject *coro = task_get_coro(task);
    if (coro == NULL)
        return NULL;
    PyObject *result = CREATE_FALLBACK, *states = NULL, *name = NULL, *coro_name = NULL, *tt = NULL;
    if (!PyCoro_CheckExact(coro))
        goto out;
    /* not started: the twin's _not_started (neither cr_running nor
     * cr_suspended; read from the coroutine's frame state) */
    int8_t st = ((PyCoroObject *)coro)->cr_frame_state;
#if PY_VERSION_HEX >= 0x030D0000
    int started = st == 0 || st == -1 || st == -2; /* executing, suspended (yield from or not) */
#else
    int started = st == 0 || st == -1; /* executing, suspended */
#endif
    if (started)
        goto out;
    states = states_in_c(ctx);
    if (states == CREATE_FALLBACK)
        states = PyObject_CallOneArg(cr_states_in, ctx);
    if (states == NULL)
        goto error;
    if (states == Py_None || (PyList_CheckExact(states) && PyList_GET_SIZE(states) == 0)) {
        /* seen: not asked again at each step */
        if (task_attr_set(task, Py_None) < 0)
            goto error;
        result = Py_None;
        goto out;
    }
    if (PyList_CheckExact(states) && PyList_GET_SIZE(states) == 1) /* a global profile's */
        Py_SETREF(states, Py_NewRef(PyList_GET_ITEM(states, 0)));
    if (!Py_IS_TYPE(states, (PyTypeObject *)cr_state_type))
        goto out; /* several profiles */
    PyObject *budget = states_ready ? Py_XNewRef(slot_at(states, off_si[SI_BUDGET]))
                                    : PyObject_GetAttr(states, str_budget);
    if (budget == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_AttributeError, "ProfilerState.budget is not set");
        goto error;
    }
    int admitted = 1;
    if (budget != Py_None && Budget_Check(budget)) { /* ProfilerState.admit(TASK), without its frame */
        int drop = aprof_budget_take((Budget *)budget, BUDGET_TASK, 1);
        admitted = drop < 0 ? -1 : !drop;
    }
    else if (budget != Py_None) {
        PyObject *ok = PyObject_CallMethodOneArg(states, str_admit, cr_budget_task);
        admitted = ok == NULL ? -1 : PyObject_IsTrue(ok);
        Py_XDECREF(ok);
    }
    Py_DECREF(budget);
    if (admitted < 0)
        goto error;
    PyObject *records = states_ready ? Py_XNewRef(slot_at(states, off_si[SI_TASK_RECORDS]))
                                     : PyObject_GetAttr(states, str_task_records);
    if (records == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_AttributeError, "ProfilerState.task_records is not set");
        goto error;
    }
    if (!PyList_CheckExact(records)) {
        Py_DECREF(records);
        goto out;
    }
    /* the task's name, and its coroutine's (a wrapped one: the twin's work) */
    int trusted = task_layout_trusted(task);
    name = finish_name(task);
    if (!trusted)
        task_layout_see(task, coro, name);
    coro_name = Py_XNewRef(((PyCoroObject *)coro)->cr_qualname); /* coro.__qualname__ */
    if (coro_name == NULL || !PyUnicode_CheckExact(coro_name) || PyUnicode_GET_LENGTH(coro_name) == 0) {
        Py_XSETREF(coro_name, PyObject_CallOneArg(cr_coro_qualname, coro));
    }
    else if (coro_name != last_qualname) { /* a wrapper's (anyio's _run_coro): the twin names the user's */
        Py_ssize_t at = PyUnicode_Find(coro_name, str_run_coro, 0, PyUnicode_GET_LENGTH(coro_name), 1);
        if (at == -2)
            PyErr_Clear();
        if (at != -1)
            Py_SETREF(coro_name, PyObject_CallOneArg(cr_coro_qualname, coro));
        else /* the same function's next coroutine shares its name: checked once */
            Py_XSETREF(last_qualname, Py_NewRef(coro_name));
    }
    if (coro_name == NULL) {
        Py_DECREF(records);
        goto error;
    }
    PyObject *id = counter_next(cr_ids), *seq = id != NULL ? counter_next(cr_seqs) : NULL;
    PyObject *steps = seq != NULL ? StepLogType.tp_alloc(&StepLogType, 0) : NULL;
    PyObject *site = steps == NULL ? NULL
                     : cr_site_in_c ? aprof_user_site(cr_site_cache, cr_is_library)
                                    : PyObject_CallFunctionObjArgs(cr_user_site, cr_site_cache, cr_is_library, NULL);
    PyObject *ref = site != NULL ? PyWeakref_NewRef(task, NULL) : NULL;
    /* tasks run on the thread that spawns them (their loop's): share its int */
    unsigned long here = PyThread_get_thread_ident();
    PyObject *sp_os = slot_at(spawner, off_tt[TT_OS_TID]), *ident = NULL;
    if (ref != NULL && sp_os != NULL && PyLong_CheckExact(sp_os) && PyLong_AsUnsignedLong(sp_os) == here)
        ident = Py_NewRef(sp_os);
    else if (ref != NULL) {
        PyErr_Clear(); /* (an OS thread id past an unsigned long: not ours) */
        ident = PyLong_FromUnsignedLong(here);
    }
    PyObject *spawn_ns = ident != NULL ? PyLong_FromUnsignedLongLong(now_ns()) : NULL;
    tt = spawn_ns != NULL ? task_thread_type->tp_alloc(task_thread_type, 0) : NULL;
    if (tt == NULL || (admitted && PyList_Append(records, tt) < 0)) {
        Py_XDECREF(id);
        Py_XDECREF(seq);
        Py_XDECREF(steps);
        Py_XDECREF(site);
        Py_XDECREF(ref);
        Py_XDECREF(ident);
        Py_XDECREF(spawn_ns);
        Py_XDECREF(records);
        Py_CLEAR(tt);
        goto error;
    }
    PyObject *os_tid = ident;
    PyObject *zero = PyLong_FromLong(0);
    set_slot(tt, off_tt[TT_ID], id);
    set_slot(tt, off_tt[TT_KIND], str_asyncio);
    set_slot(tt, off_tt[TT_NAME], name);
    set_slot(tt, off_tt[TT_OS_TID], os_tid);
    set_slot(tt, off_tt[TT_TASK_REF], ref);
    set_slot(tt, off_tt[TT_CORO], coro_name);
    set_slot(tt, off_tt[TT_FWD], slot_at(spawner, off_tt[TT_ID]) != NULL ? slot_at(spawner, off_tt[TT_ID]) : Py_None);
    set_slot(tt, off_tt[TT_SEQ], seq);
    set_slot(tt, off_tt[TT_STEPS], steps);
    set_slot(tt, off_tt[TT_WAITS], Py_None);
    set_slot(tt, off_tt[TT_READY], zero != NULL ? zero : Py_None);
    set_slot(tt, off_tt[TT_SITE], site);
    set_slot(tt, off_tt[TT_MORE], Py_None);
    set_slot(tt, off_tt[TT_SPAWN_NS], spawn_ns);
    set_slot(tt, off_tt[TT_BLOCK], Py_None);
    if (admitted) {
        /* another thread may append at the same moment: find our slot from
         * the end (nothing is ever removed, so it stays put) */
        Py_ssize_t i = PyList_GET_SIZE(records) - 1;
        while (i > 0 && PyList_GET_ITEM(records, i) != tt)
            i--;
        PyObject *idx = PyLong_FromSsize_t(i);
        set_slot(tt, off_tt[TT_STATE], states);
        set_slot(tt, off_tt[TT_RECORDS], records);
        set_slot(tt, off_tt[TT_IDX], idx != NULL ? idx : zero);
        Py_XDECREF(idx);
    }
    else {
        set_slot(tt, off_tt[TT_STATE], Py_None);
        set_slot(tt, off_tt[TT_RECORDS], no_records);
        set_slot(tt, off_tt[TT_IDX], zero != NULL ? zero : Py_None);
    }
    Py_XDECREF(zero);
    Py_DECREF(id);
    Py_DECREF(seq);
    Py_DECREF(steps);
    Py_DECREF(site);
    Py_DECREF(ref);
    Py_DECREF(ident);
    Py_DECREF(spawn_ns);
    Py_DECREF(records);
    /* bind: the task's attribute names its logical thread */
    if (task_attr_set(task, tt) < 0)
        goto error; /* recorded, not bound: its steps go untimed */
    result = tt;
    tt = NULL;
    goto out;
error:
    result = NULL;
out:
    Py_XDECREF(tt);
    Py_XDECREF(states);
    Py_XDECREF(name);
    Py_XDECREF(coro_name);
    Py_DECREF(coro);
    return result;
}

/* _task_create_setup(states_in, ids, seqs, ProfilerState, user_site,
 * site_cache, is_library, coro_qualname, budget_task) after
 * _task_finish_setup: a new C Task spawned in a recorded task's step is
 * then recorded here; None: by the Python twin (_asyncio._record). */
static PyObject *
task_create_setup(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs == 1 && args[0] == Py_None) {
        create_ready = 0;
        Py_RETURN_NONE;
    }
    if (nargs != 9 || !finish_ready || !PyType_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError,
                        "_task_create_setup(states_in, ids, seqs, ProfilerState, user_site, site_cache, is_library, "
                        "coro_qualname, budget_task) after _task_finish_setup, or _task_create_setup(None)");
        return NULL;
    }
    Py_XSETREF(c_task_get_coro, PyObject_GetAttr(c_task_type, str_get_coro));
    if (c_task_get_coro == NULL)
        return NULL;
#if PY_VERSION_HEX >= 0x030C0000
    /* (eager first steps: 3.12+) */
    Py_XSETREF(c_task_get_loop, PyObject_GetAttrString(c_task_type, "get_loop"));
    Py_XSETREF(c_task_get_context, PyObject_GetAttrString(c_task_type, "get_context"));
    if (c_task_get_loop == NULL || c_task_get_context == NULL)
        return NULL;
#endif
    PyObject **dst[9] = {&cr_states_in, &cr_ids, &cr_seqs, &cr_state_type, &cr_user_site,
                         &cr_site_cache, &cr_is_library, &cr_coro_qualname, &cr_budget_task};
    for (int i = 0; i < 9; i++)
        Py_XSETREF(*dst[i], Py_NewRef(args[i]));
    cr_site_in_c = aprof_is_user_site(cr_user_site) && PyDict_CheckExact(cr_site_cache);
    create_ready = 1;
    Py_RETURN_NONE;
}

/* _states_setup(RF_STATE, EMPTY_RF_STATE, RFState, Recorder,
 * global_task_recorders) after _task_create_setup: _tasks.states_in's
 * common cases in C; None: all in Python. */
static PyObject *
states_setup(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs == 1 && args[0] == Py_None) {
        states_ready = 0;
        Py_RETURN_NONE;
    }
    if (nargs != 5 || !create_ready || !PyType_Check(args[2]) || !PyType_Check(args[3]) ||
        !PyList_CheckExact(args[4])) {
        PyErr_SetString(PyExc_TypeError, "_states_setup(RF_STATE, EMPTY_RF_STATE, RFState, Recorder, "
                                         "global_task_recorders) after _task_create_setup, or _states_setup(None)");
        return NULL;
    }
    static const char *const rf_slots[2] = {"enabled", "recorder"};
    static const char *const rec_slots[1] = {"state"};
    static const char *const ps_slots[5] = {"tasks", "running", "budget", "task_records", "lists"};
    Py_ssize_t offs[SI_COUNT];
    if (member_offsets(args[2], rf_slots, 2, offs) < 0 || member_offsets(args[3], rec_slots, 1, offs + SI_STATE) < 0 ||
        member_offsets(cr_state_type, ps_slots, 5, offs + SI_TASKS) < 0)
        return NULL;
    memcpy(off_si, offs, sizeof off_si);
    Py_XSETREF(si_var, Py_NewRef(args[0]));
    Py_XSETREF(si_empty, Py_NewRef(args[1]));
    Py_XSETREF(si_rfstate_type, (PyTypeObject *)Py_NewRef(args[2]));
    Py_XSETREF(si_recorder_type, (PyTypeObject *)Py_NewRef(args[3]));
    Py_XSETREF(si_globals, Py_NewRef(args[4]));
    states_ready = 1;
    Py_RETURN_NONE;
}

static PyObject *
CallSoonHook_vectorcall(CallSoonHook *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs < 1)
        return hook_call_own(self, args, nargsf, kwnames);
    int is_step = 0;
    PyObject *task = task_of(args[0], &is_step);
    if (task == NULL)
        return hook_call_own(self, args, nargsf, kwnames);
    int has_lt;
    PyObject *tt = recorded(task, &has_lt);
    if (tt == NULL && !has_lt && is_step) {
        /* A task aprof has not seen: a new one scheduling its first step,
         * from its constructor, with its own context. Python decides
         * whether a running profile records it (and marks it either way). */
        PyObject *ctx = Py_None;
        Py_ssize_t nk = kwnames != NULL ? PyTuple_GET_SIZE(kwnames) : 0;
        for (Py_ssize_t i = 0; i < nk; i++) {
            if (PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, i), "context") == 0)
                ctx = args[nargs + i];
        }
        tt = create_ready && Py_IS_TYPE(task, (PyTypeObject *)c_task_type) ? create_in_c(task, ctx)
                                                                             : CREATE_FALLBACK;
        if (tt == CREATE_FALLBACK)
            tt = PyObject_CallFunctionObjArgs(on_first_scheduled, task, ctx, NULL);
        else if (tt == Py_None)
            tt = Py_NewRef(Py_None);
        if (tt == NULL) {
            report_unraisable("task creation");
        }
        else if (!Py_IS_TYPE(tt, task_thread_type)) {
            Py_CLEAR(tt);
        }
    }
    if (tt == NULL)
        return hook_call_own(self, args, nargsf, kwnames);
    PyObject *wrapped = StepCall_new_for(args[0], task, tt);
    Py_DECREF(tt);
    if (wrapped == NULL)
        return NULL;
    /* A copy of the arguments with the callback wrapped, and a free slot
     * before them for the loop (PY_VECTORCALL_ARGUMENTS_OFFSET). */
    Py_ssize_t total = nargs + (kwnames != NULL ? PyTuple_GET_SIZE(kwnames) : 0);
    PyObject *small[SMALL_ARGS + 1], **copy = small;
    if (total > SMALL_ARGS && (copy = PyMem_Malloc((size_t)(total + 1) * sizeof(PyObject *))) == NULL) {
        Py_DECREF(wrapped);
        return PyErr_NoMemory();
    }
    copy[0] = NULL;
    copy[1] = wrapped;
    for (Py_ssize_t i = 1; i < total; i++)
        copy[i + 1] = args[i];
    PyObject *result = hook_call_own(self, copy + 1, (size_t)nargs | PY_VECTORCALL_ARGUMENTS_OFFSET, kwnames);
    if (copy != small)
        PyMem_Free(copy);
    Py_DECREF(wrapped);
    return result;
}

static PyObject *
CallSoonHook_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *call_soon;
    if (!PyArg_ParseTuple(args, "O:CallSoonHook", &call_soon))
        return NULL;
    if (!PyCallable_Check(call_soon)) {
        PyErr_Format(PyExc_TypeError, "CallSoonHook: expected the loop's call_soon, got %R", call_soon);
        return NULL;
    }
    PyObject *loopref = NULL;
    if (PyMethod_Check(call_soon)) {
        loopref = PyWeakref_NewRef(PyMethod_GET_SELF(call_soon), NULL);
        if (loopref == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_TypeError))
                return NULL;
            PyErr_Clear(); /* a loop without weak references: hold it */
        }
    }
    CallSoonHook *self = (CallSoonHook *)type->tp_alloc(type, 0);
    if (self == NULL) {
        Py_XDECREF(loopref);
        return NULL;
    }
    if (loopref != NULL) {
        self->func = Py_NewRef(PyMethod_GET_FUNCTION(call_soon));
        self->loopref = loopref;
    }
    else {
        self->call_soon = Py_NewRef(call_soon);
    }
    self->vectorcall = (vectorcallfunc)CallSoonHook_vectorcall;
    return (PyObject *)self;
}

/* It reads as the loop's own call_soon: its attributes (__self__,
 * __func__, __name__, ...) and its repr. */
static PyObject *
CallSoonHook_getattro(CallSoonHook *self, PyObject *name)
{
    PyObject *v = PyObject_GenericGetAttr((PyObject *)self, name);
    if (v != NULL || !PyErr_ExceptionMatches(PyExc_AttributeError))
        return v;
    PyErr_Clear();
    PyObject *bound = hook_bound(self);
    if (bound == NULL)
        return NULL;
    v = PyObject_GetAttr(bound, name);
    Py_DECREF(bound);
    return v;
}

static PyObject *
CallSoonHook_repr(CallSoonHook *self)
{
    PyObject *bound = hook_bound(self);
    if (bound == NULL)
        return NULL;
    PyObject *r = PyObject_Repr(bound);
    Py_DECREF(bound);
    return r;
}

static PyObject *
CallSoonHook_get_own(CallSoonHook *self, void *closure)
{
    (void)closure;
    return hook_bound(self);
}

static PyGetSetDef CallSoonHook_getset[] = {
    {"_aprof_call_soon", (getter)CallSoonHook_get_own, NULL, "The loop's own call_soon.", NULL},
    {NULL},
};

static int
CallSoonHook_traverse(CallSoonHook *self, visitproc visit, void *arg)
{
    Py_VISIT(self->call_soon);
    Py_VISIT(self->func);
    Py_VISIT(self->loopref);
    return 0;
}

static int
CallSoonHook_clear(CallSoonHook *self)
{
    Py_CLEAR(self->call_soon);
    Py_CLEAR(self->func);
    Py_CLEAR(self->loopref);
    return 0;
}

static void
CallSoonHook_dealloc(CallSoonHook *self)
{
    PyObject_GC_UnTrack(self);
    if (self->weakreflist != NULL)
        PyObject_ClearWeakRefs((PyObject *)self);
    CallSoonHook_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject CallSoonHookType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "aprof._ctracer.CallSoonHook",
    .tp_basicsize = sizeof(CallSoonHook),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "CallSoonHook(call_soon)\n--\n\nA loop's call_soon that times the steps of recorded tasks.",
    .tp_vectorcall_offset = offsetof(CallSoonHook, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_new = CallSoonHook_new,
    .tp_getattro = (getattrofunc)CallSoonHook_getattro,
    .tp_repr = (reprfunc)CallSoonHook_repr,
    .tp_dealloc = (destructor)CallSoonHook_dealloc,
    .tp_traverse = (traverseproc)CallSoonHook_traverse,
    .tp_clear = (inquiry)CallSoonHook_clear,
    .tp_weaklistoffset = offsetof(CallSoonHook, weakreflist),
    .tp_getset = CallSoonHook_getset,
};

/* ------------------------------------------------------------------------ */
/* AddHook: asyncio's set of tasks' add                                       */
/* ------------------------------------------------------------------------ */

/* Set as the instance attribute `add` of asyncio's module-level set of
 * tasks, which every new task calls from its constructor. It adds, then
 * hands the task to Python only if aprof has not decided about it yet
 * (the call_soon hook decides at a task's first step, on hooked loops). */
typedef struct {
    PyObject_HEAD
    PyObject *add;      /* the set's own bound add */
    PyObject *on_task;  /* task_created(task) */
    vectorcallfunc vectorcall;
} AddHook;

static PyObject *
AddHook_vectorcall(AddHook *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    PyObject *r = PyObject_Vectorcall(self->add, args, nargsf, kwnames);
    if (r == NULL || PyVectorcall_NARGS(nargsf) != 1 || kwnames != NULL)
        return r;
    PyObject *task = args[0];
    if (!PyObject_TypeCheck(task, (PyTypeObject *)c_task_type) &&
        !(py_task_type != Py_None && PyObject_TypeCheck(task, (PyTypeObject *)py_task_type)))
        return r;
    PyObject *lt;
    if (task_attr(task, &lt) < 0) {
        PyErr_Clear();
        return r;
    }
    int decided = lt != NULL && (lt == Py_None || Py_IS_TYPE(lt, task_thread_type));
    Py_XDECREF(lt);
    if (decided)
        return r;
    PyObject *done = PyObject_CallOneArg(self->on_task, task);
    if (done == NULL)
        report_unraisable("task creation");
    Py_XDECREF(done);
    return r;
}

static PyObject *
AddHook_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *add, *on_task;
    if (!PyArg_ParseTuple(args, "OO:AddHook", &add, &on_task))
        return NULL;
    AddHook *self = (AddHook *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->add = Py_NewRef(add);
    self->on_task = Py_NewRef(on_task);
    self->vectorcall = (vectorcallfunc)AddHook_vectorcall;
    return (PyObject *)self;
}

static PyObject *
AddHook_getattro(AddHook *self, PyObject *name)
{
    return PyObject_GetAttr(self->add, name);
}

static PyObject *
AddHook_repr(AddHook *self)
{
    return PyObject_Repr(self->add);
}

static int
AddHook_traverse(AddHook *self, visitproc visit, void *arg)
{
    Py_VISIT(self->add);
    Py_VISIT(self->on_task);
    return 0;
}

static int
AddHook_clear(AddHook *self)
{
    Py_CLEAR(self->add);
    Py_CLEAR(self->on_task);
    return 0;
}

static void
AddHook_dealloc(AddHook *self)
{
    PyObject_GC_UnTrack(self);
    AddHook_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject AddHookType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "aprof._ctracer.AddHook",
    .tp_basicsize = sizeof(AddHook),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "AddHook(add, task_created)\n--\n\nasyncio's set of tasks' add, telling aprof of new tasks.",
    .tp_vectorcall_offset = offsetof(AddHook, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_new = AddHook_new,
    .tp_getattro = (getattrofunc)AddHook_getattro,
    .tp_repr = (reprfunc)AddHook_repr,
    .tp_dealloc = (destructor)AddHook_dealloc,
    .tp_traverse = (traverseproc)AddHook_traverse,
    .tp_clear = (inquiry)AddHook_clear,
};

/* ------------------------------------------------------------------------ */
/* The eager watch (3.12+)                                                    */
/* ------------------------------------------------------------------------ */

#if PY_VERSION_HEX >= 0x030C0000
/*
 * asyncio's current-task table maps each loop to its running task. A step
 * run by the loop enters the task (the loop's key is ADDED) and leaves it
 * (DELETED); those steps come through call_soon. An eager task's first step
 * runs inside the call that creates it, and asyncio *swaps* the current
 * task instead: spawner -> child, then back (two MODIFIED events), which is
 * exactly the step. (An eager task created where no task runs, in a loop
 * callback, swaps from and back to nothing: ADDED and DELETED, which look
 * like an ordinary step and are not watched; see docs/how-it-works.md.)
 *
 * A dict watcher is called before the change, for every watched dict, with
 * the GIL held and possibly with an exception being raised (the swap back
 * after a step that raised); it must not change the dict.
 */
#define EAGER_MAX 64

typedef struct {
    PyObject *task;      /* strong */
    PyObject *prev;      /* the spawner, only compared */
    PyObject *tt;        /* strong, or NULL: the child is not recorded */
    PyObject *saved_lt;  /* the stepping slot before (owned) */
    PyObject *saved_ctx; /* borrowed, only compared */
} eager_frame;

/* Allocated on a thread's first eager step and kept for the thread's life
 * (a TLS array this size would not fit the static TLS block a dlopen'ed
 * module may use). */
static APROF_TLS eager_frame *eager_stack = NULL;
static APROF_TLS int eager_depth = 0;
static APROF_TLS int eager_skipped = 0; /* swaps nested deeper than EAGER_MAX */

static int watcher_id = -1;
static PyObject *watched_dict; /* asyncio's current-task table, while watched */

/* _asyncio._eager_started(task, spawner) in C, for its common case (set up
 * with _task_create_setup): a new C Task whose eager first step starts
 * inside a recorded task's step, on a loop already hooked, no tracer
 * running. The TaskThread (new reference), Py_None (not recorded), or
 * CREATE_FALLBACK (borrowed: the twin's, nothing changed), or NULL with an
 * exception. */
static PyObject *
eager_create_in_c(PyObject *task)
{
    if (!create_ready || c_task_get_loop == NULL || c_task_get_context == NULL ||
        !Py_IS_TYPE(task, (PyTypeObject *)c_task_type) || PyList_GET_SIZE(tracer_running) > 0)
        return CREATE_FALLBACK;
    /* Its later steps are timed only on a hooked loop (the twin hooks it). */
    int trusted = task_layout_trusted(task);
    PyObject *loop = trusted ? Py_XNewRef(*(PyObject **)((char *)task + task_off_loop)) : NULL;
    if (loop == NULL && (loop = PyObject_Vectorcall(c_task_get_loop, &task, 1, NULL)) == NULL)
        return NULL;
    PyObject *call_soon = NULL;
    int has = optional_attr(loop, str_call_soon, &call_soon);
    Py_DECREF(loop);
    if (has < 0)
        return NULL;
    int hooked = call_soon != NULL && Py_IS_TYPE(call_soon, &CallSoonHookType);
    Py_XDECREF(call_soon);
    if (!hooked)
        return CREATE_FALLBACK;
    PyObject *ctx = trusted ? Py_XNewRef(task_field(task, 2)) : NULL;
    if (ctx == NULL && (ctx = PyObject_Vectorcall(c_task_get_context, &task, 1, NULL)) == NULL)
        return NULL;
    PyObject *tt = create_in_c(task, ctx);
    Py_DECREF(ctx);
    return tt;
}

static void
eager_swap_in(PyObject *task, PyObject *prev)
{
    if (eager_depth == EAGER_MAX) {
        eager_skipped++;
        return;
    }
    if (eager_stack == NULL && (eager_stack = PyMem_RawCalloc(EAGER_MAX, sizeof(eager_frame))) == NULL) {
        eager_skipped++; /* no memory: this step is not timed, its way back is skipped too */
        return;
    }
    int has_lt;
    PyObject *tt = recorded(task, &has_lt);
    if (tt == NULL && !has_lt) {
        tt = eager_create_in_c(task);
        if (tt == CREATE_FALLBACK)
            tt = PyObject_CallFunctionObjArgs(on_eager_step, task, prev, NULL);
        if (tt == NULL) {
            report_unraisable("eager task");
        }
        else if (!Py_IS_TYPE(tt, task_thread_type)) {
            Py_CLEAR(tt);
        }
    }
    eager_frame *f = &eager_stack[eager_depth++];
    f->task = Py_NewRef(task);
    f->prev = prev;
    f->tt = tt;
    f->saved_lt = aprof_stepping_lt;
    f->saved_ctx = aprof_stepping_ctx;
    /* The child's step: its own logical thread, or none (the lookup asks
     * asyncio) when it is not recorded. The context it runs in is entered
     * only after this swap, so none is published. */
    aprof_stepping_lt = tt != NULL ? Py_NewRef(tt) : NULL;
    aprof_stepping_ctx = NULL;
    if (tt != NULL) {
        PyObject *steps = slot_at(tt, off_tt[TT_STEPS]);
        if (steps != NULL && steps_push(steps, now_ns()) < 0)
            report_unraisable("eager step start");
    }
}

static void
eager_swap_back(void)
{
    eager_frame f = eager_stack[--eager_depth];
    uint64_t end = now_ns();
    PyObject *mine = aprof_stepping_lt;
    aprof_stepping_lt = f.saved_lt;
    aprof_stepping_ctx = f.saved_ctx;
    Py_XDECREF(mine);
    if (f.tt != NULL) {
        PyObject *steps = slot_at(f.tt, off_tt[TT_STEPS]);
        if (steps != NULL && steps_push(steps, end) < 0)
            report_unraisable("eager step end");
        PyObject *done = task_done(f.task);
        if (done == NULL) {
            report_unraisable("eager task end");
        }
        else if (done == Py_True) {
            PyObject *r = PyObject_CallFunctionObjArgs(on_task_done, f.tt, f.task, NULL);
            if (r == NULL)
                report_unraisable("eager task end");
            Py_XDECREF(r);
        }
        Py_XDECREF(done);
    }
    Py_XDECREF(f.tt);
    Py_DECREF(f.task);
}

static int
eager_watcher(PyDict_WatchEvent event, PyObject *dict, PyObject *key, PyObject *new_value)
{
    if (event != PyDict_EVENT_MODIFIED || dict != watched_dict || new_value == NULL)
        return 0;
    saved_exc exc = {0};
    int had_exc = PyErr_Occurred() != NULL;
    if (had_exc)
        SAVE_EXC(exc);
    PyObject *old = PyDict_GetItemWithError(dict, key); /* borrowed */
    if (old == NULL) {
        PyErr_Clear();
    }
    else if (eager_depth > 0 && eager_stack[eager_depth - 1].task == old &&
             eager_stack[eager_depth - 1].prev == new_value) {
        eager_swap_back();
    }
    else if (eager_skipped > 0) {
        eager_skipped--; /* the way back of a swap not followed */
    }
    else if (new_value != Py_None) {
        eager_swap_in(new_value, old);
    }
    if (had_exc)
        RESTORE_EXC(exc);
    return 0;
}
#endif

/* _watch_eager(table): watch asyncio's current-task table for eager steps
 * (None: stop). Returns whether it is watched (False before 3.12, or when
 * every dict watcher is taken). */
static PyObject *
watch_eager(PyObject *module, PyObject *table)
{
#if PY_VERSION_HEX >= 0x030C0000
    if (table == Py_None) {
        if (watched_dict != NULL) {
            if (PyDict_Unwatch(watcher_id, watched_dict) < 0)
                PyErr_Clear();
            Py_CLEAR(watched_dict);
        }
        Py_RETURN_FALSE;
    }
    if (!PyDict_CheckExact(table)) {
        PyErr_Format(PyExc_TypeError, "_watch_eager: expected asyncio's current-task dict, got %R", table);
        return NULL;
    }
    if (watched_dict == table)
        Py_RETURN_TRUE;
    if (watcher_id < 0 && (watcher_id = PyDict_AddWatcher(eager_watcher)) < 0) {
        PyErr_Clear(); /* every watcher id is taken: eager first steps are not timed */
        Py_RETURN_FALSE;
    }
    if (watched_dict != NULL) {
        if (PyDict_Unwatch(watcher_id, watched_dict) < 0)
            PyErr_Clear();
        Py_CLEAR(watched_dict);
    }
    if (PyDict_Watch(watcher_id, table) < 0)
        return NULL;
    watched_dict = Py_NewRef(table);
    Py_RETURN_TRUE;
#else
    Py_RETURN_FALSE;
#endif
}

/* ------------------------------------------------------------------------ */
/* The key of an await chain (what aprof/_integrations/_await_chain.py caches)  */
/* ------------------------------------------------------------------------ */

#define AWAIT_MAX_DEPTH 64 /* _await_chain._MAX_DEPTH */
static PyObject *str_cr_await, *str_cr_code, *str_cr_frame, *str_gi_yieldfrom, *str_gi_code, *str_gi_frame;
static PyObject *str_ag_code;
static PyObject *coro_await_descr, *gen_yf_descr; /* the getsets of cr_await and gi_yieldfrom (or NULL) */
static PyObject *leaf_types; /* types seen at the bottom of a chain with no cr_code/gi_code/ag_code */
static PyTypeObject *last_leaf_type; /* the last of them seen (a one-entry cache of the set; held) */

/* 1: `obj` has a non-None `name`; 0: it has none (or None); -1: an error. */
static int
has_non_none(PyObject *obj, PyObject *name)
{
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError))
            return -1;
        PyErr_Clear();
        return 0;
    }
    int r = v != Py_None;
    Py_DECREF(v);
    return r;
}

/* The raw walk of await_key: each coroutine's or generator's code (by
 * address) and instruction offset, outermost first, into codes/lastis
 * (room for AWAIT_MAX_DEPTH), their count in *n, and the awaitable at the
 * bottom in *leaf (new reference; None if the chain ends in a bare yield).
 * 1: walked; 0: a chain it leaves to the Python walk; -1: an error. */
static int
await_walk(PyObject *coro, void **codes, int *lastis, Py_ssize_t *n, PyObject **leaf)
{
    PyObject *obj = Py_NewRef(coro);
    *n = 0;
    *leaf = NULL;
    for (int depth = 0; depth < AWAIT_MAX_DEPTH; depth++) {
        PyTypeObject *t = Py_TYPE(obj);
        int is_coro = t == &PyCoro_Type;
        if (!is_coro && t != &PyGen_Type) {
            if (*n == 0)
                goto unhandled;
            if (t != last_leaf_type) {
                int known = PySet_Contains(leaf_types, (PyObject *)t);
                if (known < 0)
                    goto error;
                if (!known) {
                    PyObject *names[3] = {str_cr_code, str_gi_code, str_ag_code};
                    for (int i = 0; i < 3; i++) {
                        int has = has_non_none(obj, names[i]);
                        if (has < 0)
                            goto error;
                        if (has)
                            goto unhandled;
                    }
                    if (PySet_GET_SIZE(leaf_types) >= 256 && PySet_Clear(leaf_types) < 0)
                        goto error;
                    if (PySet_Add(leaf_types, (PyObject *)t) < 0)
                        goto error;
                }
                Py_XSETREF(last_leaf_type, (PyTypeObject *)Py_NewRef(t));
            }
            *leaf = obj;
            return 1;
        }
        PyObject *code;
        if (!aprof_gen_site(obj, &code, &lastis[*n])) { /* not suspended: as Python reads it */
            code = PyObject_GetAttr(obj, is_coro ? str_cr_code : str_gi_code);
            if (code == NULL)
                goto error;
            Py_DECREF(code); /* by address: the caller keeps the codes alive as long as it keeps the key */
            PyObject *frame = PyObject_GetAttr(obj, is_coro ? str_cr_frame : str_gi_frame);
            if (frame == NULL)
                goto error;
            lastis[*n] = PyFrame_Check(frame) ? PyFrame_GetLasti((PyFrameObject *)frame) : -1;
            Py_DECREF(frame);
        }
        codes[(*n)++] = code;
        PyObject *next = is_coro ? getset_get(coro_await_descr, obj, str_cr_await)
                                 : getset_get(gen_yf_descr, obj, str_gi_yieldfrom);
        if (next == NULL)
            goto error;
        if (next == Py_None) {
            Py_DECREF(next);
            break;
        }
        PyTypeObject *nt = Py_TYPE(next);
        if (nt != &PyCoro_Type && nt != &PyGen_Type && nt != last_leaf_type) {
            const char *name = nt->tp_name;
            if (strcmp(name, "async_generator_asend") == 0 || strcmp(name, "async_generator_athrow") == 0) {
                Py_DECREF(next);
                goto unhandled;
            }
        }
        Py_SETREF(obj, next);
    }
    Py_DECREF(obj);
    *leaf = Py_NewRef(Py_None);
    return 1;
unhandled:
    Py_DECREF(obj);
    return 0;
error:
    Py_DECREF(obj);
    return -1;
}

/* The key tuple (id(code), lasti, ...) of a walk (new reference). */
static PyObject *
await_key_tuple(void *const *codes, const int *lastis, Py_ssize_t n)
{
    PyObject *key = PyTuple_New(2 * n);
    if (key == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *c = PyLong_FromVoidPtr(codes[i]), *l = c != NULL ? PyLong_FromLong(lastis[i]) : NULL;
        if (l == NULL) {
            Py_XDECREF(c);
            Py_DECREF(key);
            return NULL;
        }
        PyTuple_SET_ITEM(key, 2 * i, c);
        PyTuple_SET_ITEM(key, 2 * i + 1, l);
    }
    return key;
}

/* await_key(coro) -> ((id(code), lasti, ...), leaf) | None

   The chain of a suspended coroutine walked as _await_chain._walk walks it,
   outermost first: each coroutine's or generator's code (by address) and
   instruction offset, and the awaitable at the bottom (None if the chain
   ends in a bare yield). None when the chain holds anything else (an async
   generator's asend, a Cython coroutine...): the Python walk then says. The
   caller keeps the codes alive while it keeps the key (their addresses are
   the key). */
static PyObject *
await_key(PyObject *Py_UNUSED(module), PyObject *coro)
{
    void *codes[AWAIT_MAX_DEPTH];
    int lastis[AWAIT_MAX_DEPTH];
    Py_ssize_t n;
    PyObject *leaf;
    int r = await_walk(coro, codes, lastis, &n, &leaf);
    if (r <= 0)
        return r < 0 ? NULL : Py_NewRef(Py_None);
    PyObject *key = await_key_tuple(codes, lastis, n);
    PyObject *result = key != NULL ? PyTuple_Pack(2, key, leaf) : NULL;
    Py_XDECREF(key);
    Py_DECREF(leaf);
    return result;
}

/* ------------------------------------------------------------------------ */
/* A long wait described in C: the common path of _tasks.note_wait (a C     */
/* Task whose await chain's call site is cached), of _await_chain.wait_at   */
/* (the future a C Task waits on: a task, a plain future, an executor job)  */
/* and of WaitLog.add. Their twins, in Python, do everything else: a call    */
/* site seen for the first time, trio, the Python Task, odd futures.         */
/* ------------------------------------------------------------------------ */

static PyObject *w_sites;          /* _await_chain._sites: chain key -> site */
static PyObject *w_wait_at;        /* _await_chain.wait_at(site, task, leaf) */
static PyObject *w_future_type;    /* asyncio.Future (the C one) */
static Py_ssize_t w_max_runs;
static PyObject *str_children, *str_callbacks, *str_chain_future, *str_add,
    *str_kind_task, *str_kind_executor, *str_kind_future, *str_a_future, *str_executor_job, *str_unnamed,
    *str_task_open, *str_paren_open, *str_paren_close, *str_empty;

/* f"task {name!r} ({qualname})" when both are ASCII and repr(name) is the
 * name in single quotes (printable, no quote, no backslash): new
 * reference, or NULL (no exception: the caller joins it; or one). */
static PyObject *
task_what_ascii(PyObject *name, PyObject *qualname)
{
    if (!PyUnicode_CheckExact(name) || !PyUnicode_CheckExact(qualname) || !PyUnicode_IS_ASCII(name) ||
        !PyUnicode_IS_ASCII(qualname))
        return NULL;
    const Py_UCS1 *s = PyUnicode_1BYTE_DATA(name);
    Py_ssize_t n = PyUnicode_GET_LENGTH(name), q = PyUnicode_GET_LENGTH(qualname);
    for (Py_ssize_t i = 0; i < n; i++)
        if (s[i] < 0x20 || s[i] >= 0x7f || s[i] == '\'' || s[i] == '\\')
            return NULL;
    PyObject *r = PyUnicode_New(6 + n + 3 + q + 1, 127);
    if (r == NULL)
        return NULL;
    Py_UCS1 *d = PyUnicode_1BYTE_DATA(r);
    memcpy(d, "task '", 6);
    memcpy(d + 6, s, (size_t)n);
    memcpy(d + 6 + n, "' (", 3);
    memcpy(d + 9 + n, PyUnicode_1BYTE_DATA(qualname), (size_t)q);
    d[9 + n + q] = ')';
    return r;
}

/* What the future a C Task waits on is, as _describe_future says it: 1
 * with *what (new reference) and *kind (borrowed: an interned constant),
 * 0 when it is the twin's to say (a Python Task, a Future subclass), -1
 * with an exception. */
static int
describe_future_c(PyObject *fut, PyObject **what_out, PyObject **kind_out)
{
    *kind_out = str_kind_task;
    if (Py_IS_TYPE(fut, (PyTypeObject *)c_task_type)) {
        PyObject *name = task_layout_trusted(fut) ? task_name_in_place(fut) : NULL;
        if (name == NULL) {
            name = PyObject_Vectorcall(c_task_get_name, &fut, 1, NULL);
            if (name != NULL && !PyUnicode_CheckExact(name))
                Py_SETREF(name, PyObject_Str(name));
        }
        if (name == NULL) { /* the twin: str(get_name()), or "?" if that fails */
            PyErr_Clear();
            name = Py_NewRef(str_unnamed);
        }
        PyObject *coro = task_get_coro(fut);
        if (coro == NULL || !PyCoro_CheckExact(coro)) {
            Py_DECREF(name);
            if (coro == NULL)
                return -1;
            Py_DECREF(coro);
            return 0;
        }
        PyObject *code = aprof_gen_code(coro); /* its frame's, in place (the task may be done) */
        if (code != NULL)
            Py_INCREF(code);
        else
            code = PyObject_GetAttr(coro, str_cr_code);
        Py_DECREF(coro);
        if (code == NULL || !PyCode_Check(code)) {
            Py_DECREF(name);
            Py_XDECREF(code);
            return code == NULL ? -1 : 0;
        }
        /* f"task {name!r} ({qualname})": written out for an ASCII name that
         * repr() quotes as it is ("Task-12"), else joined (PyUnicode_FromFormat
         * parses its format at every call: twice the cost) */
        PyObject *qualname = ((PyCodeObject *)code)->co_qualname;
        PyObject *what = task_what_ascii(name, qualname);
        if (what == NULL && !PyErr_Occurred()) {
            PyObject *quoted = PyObject_Repr(name);
            if (quoted != NULL) {
                PyObject *parts = PyTuple_Pack(5, str_task_open, quoted, str_paren_open, qualname, str_paren_close);
                what = parts != NULL ? PyUnicode_Join(str_empty, parts) : NULL;
                Py_XDECREF(parts);
                Py_DECREF(quoted);
            }
        }
        Py_DECREF(name);
        Py_DECREF(code);
        *what_out = what;
        return what != NULL ? 1 : -1;
    }
    if (!Py_IS_TYPE(fut, (PyTypeObject *)w_future_type))
        return 0;
    /* A plain future: asyncio.gather's is a subclass, but a plain one may
     * carry a _children attribute all the same (the twin looks): in its
     * instance dict, which most futures never make (the class has none). */
    Py_ssize_t dict_off = Py_TYPE(fut)->tp_dictoffset;
    if (dict_off <= 0 || *(PyObject **)((char *)fut + dict_off) != NULL) {
        PyObject *children = NULL;
        if (optional_attr(fut, str_children, &children) < 0)
            return -1;
        int is_list = children != NULL && PyList_Check(children);
        Py_XDECREF(children);
        if (is_list)
            return 0;
    }
    PyObject *callbacks = NULL;
    if (c_future_callbacks != NULL) { /* (a getset: a plain future has no other) */
        callbacks = getset_get(c_future_callbacks, fut, str_callbacks);
        if (callbacks == NULL)
            return -1;
    }
    else if (optional_attr(fut, str_callbacks, &callbacks) < 0)
        return -1;
    PyObject *kind = str_kind_future, *what = str_a_future;
    if (callbacks != NULL && PyList_CheckExact(callbacks)) {
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(callbacks); i++) {
            PyObject *cb = PyList_GET_ITEM(callbacks, i);
            PyObject *fn = PyTuple_Check(cb) && PyTuple_GET_SIZE(cb) > 0 ? PyTuple_GET_ITEM(cb, 0) : cb;
            int found;
            if (PyCFunction_Check(fn)) {
                /* a builtin (the waiting task's wakeup): its __qualname__ is
                 * its type's name and its own, made anew at each read */
                const char *ml_name = ((PyCFunctionObject *)fn)->m_ml->ml_name;
                found = ml_name != NULL && strstr(ml_name, "_chain_future") != NULL;
            }
            else {
                PyObject *qualname = NULL;
                if (PyFunction_Check(fn))
                    qualname = Py_XNewRef(((PyFunctionObject *)fn)->func_qualname);
                else if (optional_attr(fn, str_qualname, &qualname) < 0) {
                    Py_DECREF(callbacks);
                    return -1;
                }
                found = qualname != NULL && PyUnicode_Check(qualname) &&
                        PyUnicode_Find(qualname, str_chain_future, 0, PyUnicode_GET_LENGTH(qualname), 1) >= 0;
                Py_XDECREF(qualname);
            }
            if (found) {
                kind = str_kind_executor;
                what = str_executor_job;
                break;
            }
        }
    }
    else if (callbacks != NULL && callbacks != Py_None) { /* not what asyncio's C Future holds */
        Py_DECREF(callbacks);
        return 0;
    }
    Py_XDECREF(callbacks);
    *what_out = Py_NewRef(what);
    *kind_out = kind;
    return 1;
}

/* The four values of a Wait (what, kind, where, caller) into w (new
 * references): 0, or -1 with an exception (w untouched). */
static int
wait_values(PyObject *wait, PyObject **w)
{
    if (!PyTuple_Check(wait) || PyTuple_GET_SIZE(wait) != 4) {
        PyErr_SetString(PyExc_TypeError, "aprof: a wait is not a (what, kind, where, caller) tuple");
        return -1;
    }
    for (int k = 0; k < 4; k++)
        w[k] = Py_NewRef(PyTuple_GET_ITEM(wait, k));
    return 0;
}

/* _await_chain.wait_at(site, task, leaf) for a C Task: the wait's four
 * values (what, kind, where, caller) into w (new references), 0; or -1
 * with an exception. No tuple made on its common paths. */
static int
wait_at_c(PyObject *site, PyObject *task, PyObject *leaf, PyObject **w)
{
    PyObject *decided = PyTuple_GET_ITEM(site, 0);
    if (decided != Py_None)
        return wait_values(decided, w);
    PyObject *entry = PyTuple_GET_ITEM(site, 1), *where = PyTuple_GET_ITEM(site, 2),
             *caller = PyTuple_GET_ITEM(site, 3);
    PyObject *fut = NULL, *what = NULL, *kind = NULL;
    if (task_fut_waiter(task, &fut) < 0)
        return -1;
    int described = fut != NULL && fut != Py_None ? describe_future_c(fut, &what, &kind) : 0;
    Py_XDECREF(fut);
    if (described < 0)
        return -1;
    if (!described || (entry != Py_None && (!PyTuple_CheckExact(entry) || PyTuple_GET_SIZE(entry) != 2))) {
        Py_XDECREF(what);
        PyObject *args[3] = {site, task, leaf};
        PyObject *wait = PyObject_Vectorcall(w_wait_at, args, 3, NULL);
        int rc = wait != NULL ? wait_values(wait, w) : -1;
        Py_XDECREF(wait);
        return rc;
    }
    /* The user's code awaits the future itself (no entry point), or the
     * entry point's kind says little and the future names a child task or
     * an executor job; else the entry point says it. */
    if (entry != Py_None && kind != str_kind_task && kind != str_kind_executor) {
        Py_SETREF(what, Py_NewRef(PyTuple_GET_ITEM(entry, 0)));
        kind = PyTuple_GET_ITEM(entry, 1);
    }
    w[0] = what;
    w[1] = Py_NewRef(kind);
    w[2] = Py_NewRef(where);
    w[3] = Py_NewRef(caller);
    return 0;
}

/* ------------------------------------------------------------------------ */
/* WaitLog: a task's long waits, as runs, in C                               */
/* ------------------------------------------------------------------------ */

/* The C form of _await_chain.WaitLog (its twin, which the pure-Python path
 * uses; the contract is there): runs of consecutive waits on the same
 * thing, the longest max_runs of them kept once there are more (the open
 * run, the last, never goes). A run is a struct here, its times uint64s:
 * a keep-alive connection's task adds a run at every wait, and as a list
 * of ten objects each run made three ints and a list (and took them apart
 * again once the log was full), about 1,000 instructions a wait, and a GC
 * container per run the collector counted (issue 19). The log holds only
 * strs (the wait's four texts), so it is no GC container either; `runs`
 * makes the lists of the twin's form when it is read (at stop, by a
 * flight recorder's dump), and iterating the log gives them too, so a
 * finished task's record holds the log itself.
 *
 * Runs sit in slots, in arrival order through `order` (slot indices); once
 * the log is full, `heap` holds the closed runs' (longest, arrival) pairs
 * in a min-heap, and a new run takes the slot of the run it drops. */
typedef struct {
    uint64_t longest, arrival;
} wait_heap_entry;

typedef struct {
    uint64_t start, end, count, total, longest, longest_end, arrival;
    PyObject *what, *kind, *where, *caller; /* exact strs */
} WaitRun;

typedef struct {
    PyObject_HEAD
    WaitRun *slots;
    int32_t *order;        /* n slot indices, the oldest run first; the last is the open one */
    wait_heap_entry *heap; /* once full: the n - 1 closed runs, a min-heap; NULL before */
    Py_ssize_t n, cap;
    uint64_t next_arrival;
} WaitLog;

static Py_ssize_t w_max_runs = 64; /* _await_chain.WaitLog.max_runs (_waits_setup) */

static inline int
whe_less(const wait_heap_entry *x, const wait_heap_entry *y)
{
    return x->longest < y->longest || (x->longest == y->longest && x->arrival < y->arrival);
}

static void
wait_heap_down(wait_heap_entry *h, Py_ssize_t n, Py_ssize_t i)
{
    wait_heap_entry item = h[i];
    for (;;) {
        Py_ssize_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && whe_less(&h[c + 1], &h[c]))
            c++;
        if (!whe_less(&h[c], &item))
            break;
        h[i] = h[c];
        i = c;
    }
    h[i] = item;
}

/* a == b for two exact strs without a rich comparison's dispatch (the
 * what and where of consecutive waits: most often other strings); else as
 * == says. 1, 0, or -1 with an exception. */
static inline int
same_text(PyObject *a, PyObject *b)
{
    if (a == b)
        return 1;
    if (PyUnicode_CheckExact(a) && PyUnicode_CheckExact(b)) {
        Py_ssize_t n = PyUnicode_GET_LENGTH(a);
        if (n != PyUnicode_GET_LENGTH(b) || PyUnicode_KIND(a) != PyUnicode_KIND(b))
            return 0;
        return memcmp(PyUnicode_DATA(a), PyUnicode_DATA(b), (size_t)n * PyUnicode_KIND(a)) == 0;
    }
    return PyObject_RichCompareBool(a, b, Py_EQ);
}

/* A run's four texts (the wait's: what, kind, where, caller), exact strs
 * (str() of anything else: the log holds plain data only), into r. 0, or
 * -1 with an exception (r untouched). */
static int
run_texts(WaitRun *r, PyObject *const *wait)
{
    PyObject *t[4];
    for (int k = 0; k < 4; k++) {
        t[k] = PyUnicode_CheckExact(wait[k]) ? Py_NewRef(wait[k]) : PyObject_Str(wait[k]);
        if (t[k] == NULL) {
            while (--k >= 0)
                Py_DECREF(t[k]);
            return -1;
        }
    }
    Py_XSETREF(r->what, t[0]);
    Py_XSETREF(r->kind, t[1]);
    Py_XSETREF(r->where, t[2]);
    Py_XSETREF(r->caller, t[3]);
    return 0;
}

/* The closed runs (all but the last) into a new heap: the first time the
 * log is full. 0, or -1 with an exception. */
static int
waitlog_heap(WaitLog *log)
{
    wait_heap_entry *h = PyMem_Malloc((size_t)(w_max_runs > log->n ? w_max_runs : log->n) * sizeof *h);
    if (h == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t m = log->n - 1;
    for (Py_ssize_t k = 0; k < m; k++) {
        WaitRun *r = &log->slots[log->order[k]];
        h[k].longest = r->longest;
        h[k].arrival = r->arrival;
    }
    for (Py_ssize_t k = m / 2 - 1; k >= 0; k--)
        wait_heap_down(h, m, k);
    log->heap = h;
    return 0;
}

/* WaitLog.add(start, end, wait) in C, the wait as its four values (what,
 * kind, where, caller). 0, or -1 with an exception (the log as it was). */
static int
waitlog_add(WaitLog *log, uint64_t start, uint64_t end, PyObject *const *wait)
{
    uint64_t waited = end >= start ? end - start : 0;
    if (log->n > 0) {
        WaitRun *last = &log->slots[log->order[log->n - 1]];
        int same = same_text(last->what, wait[0]);
        if (same > 0)
            same = same_text(last->where, wait[2]);
        if (same < 0)
            return -1;
        if (same) {
            last->end = end;
            last->count++;
            last->total += waited;
            if (waited > last->longest) {
                last->longest = waited;
                last->longest_end = end;
            }
            return 0;
        }
    }
    WaitRun *r;
    if (log->n >= w_max_runs && log->n >= 2) {
        /* Full: the run just closed joins the heap, and the closed run whose
         * longest wait is shortest (the first of equals) goes; the new run
         * takes its slot, at the end. */
        if (log->heap == NULL && waitlog_heap(log) < 0)
            return -1;
        Py_ssize_t m = log->n - 1; /* closed runs in the heap */
        WaitRun *closing = &log->slots[log->order[m]];
        wait_heap_entry c = {closing->longest, closing->arrival}, gone;
        if (m == 0 || whe_less(&c, &log->heap[0]))
            gone = c;
        else {
            gone = log->heap[0];
            log->heap[0] = c;
            wait_heap_down(log->heap, m, 0);
        }
        Py_ssize_t lo = gone.arrival == c.arrival ? m : 0, hi = lo == m ? lo : log->n;
        /* the gone run's place (the one just closed: the last but the new
         * one's, most often; else sought: arrivals rise along order) */
        while (lo < hi) {
            Py_ssize_t mid = (lo + hi) / 2;
            if (log->slots[log->order[mid]].arrival < gone.arrival)
                lo = mid + 1;
            else
                hi = mid;
        }
        if (lo >= log->n || log->slots[log->order[lo]].arrival != gone.arrival) {
            PyErr_SetString(PyExc_SystemError, "aprof: a wait log's runs and heap disagree");
            return -1;
        }
        int32_t slot = log->order[lo];
        if (run_texts(&log->slots[slot], wait) < 0) {
            /* (the heap changed: rebuilt at the next full add) */
            PyMem_Free(log->heap);
            log->heap = NULL;
            return -1;
        }
        memmove(log->order + lo, log->order + lo + 1, (size_t)(log->n - 1 - lo) * sizeof(int32_t));
        log->order[log->n - 1] = slot;
        r = &log->slots[slot];
    }
    else {
        if (log->n == log->cap) {
            Py_ssize_t cap = log->cap < 4 ? 4 : log->cap * 2;
            if (cap > w_max_runs && w_max_runs >= log->n + 1)
                cap = w_max_runs;
            WaitRun *slots = PyMem_Realloc(log->slots, (size_t)cap * sizeof(WaitRun));
            if (slots == NULL) {
                PyErr_NoMemory();
                return -1;
            }
            log->slots = slots;
            int32_t *order = PyMem_Realloc(log->order, (size_t)cap * sizeof(int32_t));
            if (order == NULL) {
                PyErr_NoMemory();
                return -1;
            }
            log->order = order;
            for (Py_ssize_t k = log->cap; k < cap; k++)
                log->slots[k].what = log->slots[k].kind = log->slots[k].where = log->slots[k].caller = NULL;
            log->cap = cap;
        }
        r = &log->slots[log->n];
        if (run_texts(r, wait) < 0)
            return -1;
        log->order[log->n] = (int32_t)log->n;
        log->n++;
        if (log->heap != NULL) { /* (only a raised max_runs leaves one: rebuilt when full) */
            PyMem_Free(log->heap);
            log->heap = NULL;
        }
    }
    r->start = start;
    r->end = end;
    r->count = 1;
    r->total = r->longest = waited;
    r->longest_end = end;
    r->arrival = log->next_arrival++;
    return 0;
}

/* [start, end, count, total, longest, what, kind, where, caller,
 * longest_end]: a run as the twin holds it (new reference). */
static PyObject *
run_list(const WaitRun *r)
{
    PyObject *v[10] = {PyLong_FromUnsignedLongLong(r->start), PyLong_FromUnsignedLongLong(r->end),
                       PyLong_FromUnsignedLongLong(r->count), PyLong_FromUnsignedLongLong(r->total),
                       PyLong_FromUnsignedLongLong(r->longest), Py_NewRef(r->what), Py_NewRef(r->kind),
                       Py_NewRef(r->where), Py_NewRef(r->caller), PyLong_FromUnsignedLongLong(r->longest_end)};
    PyObject *lst = PyList_New(10);
    for (int k = 0; k < 10; k++) {
        if (lst != NULL && v[k] != NULL)
            PyList_SET_ITEM(lst, k, v[k]);
        else
            Py_XDECREF(v[k]);
    }
    if (lst != NULL)
        for (int k = 0; k < 10; k++)
            if (v[k] == NULL) {
                Py_DECREF(lst); /* (a NULL item: list_dealloc skips it) */
                return NULL;
            }
    return lst;
}

static PyObject *
WaitLog_get_runs(WaitLog *self, void *closure)
{
    PyObject *out = PyList_New(self->n);
    for (Py_ssize_t k = 0; out != NULL && k < self->n; k++) {
        PyObject *run = run_list(&self->slots[self->order[k]]);
        if (run == NULL)
            Py_CLEAR(out);
        else
            PyList_SET_ITEM(out, k, run);
    }
    return out;
}

static PyObject *
WaitLog_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    if (PyTuple_GET_SIZE(args) > 0 || (kwds != NULL && PyDict_GET_SIZE(kwds) > 0)) {
        PyErr_SetString(PyExc_TypeError, "WaitLog() takes no arguments");
        return NULL;
    }
    WaitLog *log = PyObject_New(WaitLog, type);
    if (log == NULL)
        return NULL;
    log->slots = NULL;
    log->order = NULL;
    log->heap = NULL;
    log->n = log->cap = 0;
    log->next_arrival = 0;
    return (PyObject *)log;
}

static void
WaitLog_dealloc(WaitLog *self)
{
    for (Py_ssize_t k = 0; k < self->cap; k++) {
        WaitRun *r = &self->slots[k];
        Py_XDECREF(r->what);
        Py_XDECREF(r->kind);
        Py_XDECREF(r->where);
        Py_XDECREF(r->caller);
    }
    PyMem_Free(self->slots);
    PyMem_Free(self->order);
    PyMem_Free(self->heap);
    PyObject_Free(self);
}

/* add(start_ns, end_ns, wait): WaitLog.add, wait a (what, kind, where,
 * caller) tuple. */
static PyObject *
WaitLog_add(WaitLog *self, PyObject *const *args, Py_ssize_t nargs)
{
    unsigned long long start, end;
    if (nargs != 3 || !PyTuple_Check(args[2]) || PyTuple_GET_SIZE(args[2]) != 4) {
        PyErr_SetString(PyExc_TypeError, "WaitLog.add(start_ns: int, end_ns: int, wait: (what, kind, where, caller))");
        return NULL;
    }
    if ((start = PyLong_AsUnsignedLongLong(args[0])) == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    if ((end = PyLong_AsUnsignedLongLong(args[1])) == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    if (waitlog_add(self, start, end, &PyTuple_GET_ITEM(args[2], 0)) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *
WaitLog_sizeof(WaitLog *self, PyObject *Py_UNUSED(ignored))
{
    size_t n = sizeof(WaitLog) + (size_t)self->cap * (sizeof(WaitRun) + sizeof(int32_t));
    if (self->heap != NULL)
        n += (size_t)(w_max_runs > self->n ? w_max_runs : self->n) * sizeof(wait_heap_entry);
    return PyLong_FromSize_t(n);
}

static Py_ssize_t
WaitLog_len(WaitLog *self)
{
    return self->n;
}

static PyObject *
WaitLog_iter(WaitLog *self)
{
    PyObject *runs = WaitLog_get_runs(self, NULL);
    if (runs == NULL)
        return NULL;
    PyObject *it = PyObject_GetIter(runs);
    Py_DECREF(runs);
    return it;
}

static PyObject *
WaitLog_repr(WaitLog *self)
{
    return PyUnicode_FromFormat("<WaitLog of %zd runs>", self->n);
}

static PyMethodDef WaitLog_methods[] = {
    {"add", (PyCFunction)(void (*)(void))WaitLog_add, METH_FASTCALL,
     "add(start_ns, end_ns, wait): a long wait, from start_ns to end_ns, on wait (what, kind, where, caller)."},
    {"__sizeof__", (PyCFunction)WaitLog_sizeof, METH_NOARGS, "Its size in memory, its runs' room included."},
    {NULL},
};

static PyGetSetDef WaitLog_getset[] = {
    {"runs", (getter)WaitLog_get_runs, NULL,
     "The runs, oldest first: [start, end, count, total, longest, what, kind, where, caller, longest_end] "
     "each (new lists: the extra[\"waits\"] form).",
     NULL},
    {NULL},
};

static PySequenceMethods WaitLog_as_sequence = {
    .sq_length = (lenfunc)WaitLog_len,
};

static PyObject *empty_args; /* () */

static PyTypeObject WaitLogType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "aprof._ctracer.WaitLog",
    .tp_basicsize = sizeof(WaitLog),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "WaitLog()\n--\n\nA task's long waits, as runs of consecutive waits on the same thing "
              "(aprof._integrations._await_chain.WaitLog in C; no GC container).",
    .tp_new = WaitLog_new,
    .tp_dealloc = (destructor)WaitLog_dealloc,
    .tp_repr = (reprfunc)WaitLog_repr,
    .tp_iter = (getiterfunc)WaitLog_iter,
    .tp_methods = WaitLog_methods,
    .tp_getset = WaitLog_getset,
    .tp_as_sequence = &WaitLog_as_sequence,
};

/* log.add(start, end, (what, kind, where, caller)), the method (a log of
 * another type: the twin's): 0, or -1 with an exception. */
static int
call_log_add(PyObject *log, uint64_t start, uint64_t end, PyObject *const *wait)
{
    PyObject *s = PyLong_FromUnsignedLongLong(start), *e = s != NULL ? PyLong_FromUnsignedLongLong(end) : NULL;
    PyObject *t = e != NULL ? PyTuple_Pack(4, wait[0], wait[1], wait[2], wait[3]) : NULL;
    PyObject *r = t != NULL ? PyObject_CallMethodObjArgs(log, str_add, s, e, t, NULL) : NULL;
    Py_XDECREF(s);
    Py_XDECREF(e);
    Py_XDECREF(t);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

/* The call sites of the last chains seen, by their walk: _sites[key]
 * without building the key (a tuple of 2n ints) and hashing it at every
 * wait. An entry holds its site, and the site its codes: the addresses it
 * compares stay theirs. A site is what the chain's codes and offsets say,
 * so an entry outliving its _sites entry (cleared at _MAX_CACHED) still
 * says the same. */
#define SITE_MEMO_SIZE 64 /* a power of two */
#define SITE_MEMO_DEPTH 6
typedef struct {
    PyObject *site; /* NULL: empty */
    Py_ssize_t n;
    void *codes[SITE_MEMO_DEPTH];
    int lastis[SITE_MEMO_DEPTH];
} site_memo_entry;
static site_memo_entry site_memo[SITE_MEMO_SIZE];

static void
site_memo_clear(void)
{
    for (int i = 0; i < SITE_MEMO_SIZE; i++)
        Py_CLEAR(site_memo[i].site);
}

/* The cached site of a walk (new reference), or Py_None (borrowed: not
 * cached: the twin describes it first), or NULL with an exception. */
static PyObject *
site_of(void *const *codes, const int *lastis, Py_ssize_t n)
{
    uint64_t h = 1469598103934665603ULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        h = (h ^ (uint64_t)(uintptr_t)codes[i]) * 1099511628211ULL;
        h = (h ^ (uint64_t)(uint32_t)lastis[i]) * 1099511628211ULL;
    }
    site_memo_entry *e = &site_memo[(h ^ (h >> 29)) & (SITE_MEMO_SIZE - 1)];
    if (e->site != NULL && e->n == n && n <= SITE_MEMO_DEPTH &&
        memcmp(e->codes, codes, (size_t)n * sizeof(void *)) == 0 &&
        memcmp(e->lastis, lastis, (size_t)n * sizeof(int)) == 0)
        return Py_NewRef(e->site);
    PyObject *key = await_key_tuple(codes, lastis, n);
    if (key == NULL)
        return NULL;
    PyObject *site = PyDict_GetItemWithError(w_sites, key);
    Py_DECREF(key);
    if (site == NULL || !PyTuple_CheckExact(site) || PyTuple_GET_SIZE(site) != 5)
        return PyErr_Occurred() ? NULL : Py_None;
    if (n <= SITE_MEMO_DEPTH) {
        Py_XSETREF(e->site, Py_NewRef(site));
        e->n = n;
        memcpy(e->codes, codes, (size_t)n * sizeof(void *));
        memcpy(e->lastis, lastis, (size_t)n * sizeof(int));
    }
    return Py_NewRef(site);
}

/* A long wait of `task`, from `start` to `end`, into tt's wait log: 1 if
 * done here, 0 if it is the twin's (nothing changed), -1 with an exception.
 * Called before the task's next step, so its coroutine is suspended. */
static int
note_wait_c(PyObject *tt, PyObject *task, uint64_t start, uint64_t end)
{
    if (!waits_ready || c_task_get_coro == NULL || c_task_get_name == NULL ||
        !Py_IS_TYPE(task, (PyTypeObject *)c_task_type) ||
        !Py_IS_TYPE(tt, task_thread_type))
        return 0;
    PyObject *coro = task_get_coro(task);
    if (coro == NULL)
        return -1;
    if (!PyCoro_CheckExact(coro)) {
        Py_DECREF(coro);
        return 0;
    }
    void *codes[AWAIT_MAX_DEPTH];
    int lastis[AWAIT_MAX_DEPTH];
    Py_ssize_t n;
    PyObject *leaf;
    int walked = await_walk(coro, codes, lastis, &n, &leaf);
    Py_DECREF(coro);
    if (walked <= 0)
        return walked;
    PyObject *site = site_of(codes, lastis, n);
    if (site == NULL || site == Py_None) {
        Py_DECREF(leaf);
        return site == NULL ? -1 : 0; /* a site seen for the first time: the twin's */
    }
    PyObject *wait[4];
    int described = wait_at_c(site, task, leaf, wait);
    Py_DECREF(site);
    Py_DECREF(leaf);
    if (described < 0)
        return -1;
    PyObject *log = slot_at(tt, off_tt[TT_WAITS]);
    if (log == NULL || log == Py_None) {
        log = WaitLogType.tp_new(&WaitLogType, empty_args, NULL);
        if (log != NULL) {
            set_slot(tt, off_tt[TT_WAITS], log);
            Py_DECREF(log);
        }
    }
    int rc = log == NULL                         ? -1
             : Py_IS_TYPE(log, &WaitLogType) ? waitlog_add((WaitLog *)log, start, end, wait)
                                             : call_log_add(log, start, end, wait);
    for (int k = 0; k < 4; k++)
        Py_DECREF(wait[k]);
    return rc < 0 ? -1 : 1;
}

/* _states_in(ctx): states_in_c alone (tests compare it with the twin). */
static PyObject *
states_in_py(PyObject *Py_UNUSED(module), PyObject *ctx)
{
    PyObject *r = states_in_c(ctx);
    return r == CREATE_FALLBACK ? Py_NewRef(r) : r;
}

/* _waits_setup(WaitLog, sites, wait_at, Future): describe long waits of C
 * Tasks in C; _waits_setup(None): in Python. */
static PyObject *
waits_setup(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs == 1 && args[0] == Py_None) {
        waits_ready = 0;
        site_memo_clear();
        Py_RETURN_NONE;
    }
    if (nargs != 4 || !PyType_Check(args[0]) || !PyDict_CheckExact(args[1]) || !PyType_Check(args[3]) ||
        task_thread_type == NULL) {
        PyErr_SetString(PyExc_TypeError, "_waits_setup(WaitLog, sites, wait_at, Future) after _tasks_setup, "
                                         "or _waits_setup(None)");
        return NULL;
    }
    PyObject *max_runs = PyObject_GetAttrString(args[0], "max_runs"); /* the twin's: the C log keeps as many */
    w_max_runs = max_runs != NULL ? PyLong_AsSsize_t(max_runs) : -1;
    Py_XDECREF(max_runs);
    if (w_max_runs < 1) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "_waits_setup: WaitLog.max_runs must be positive");
        return NULL;
    }
    Py_XSETREF(w_sites, Py_NewRef(args[1]));
    Py_XSETREF(w_wait_at, Py_NewRef(args[2]));
    Py_XSETREF(w_future_type, Py_NewRef(args[3]));
    PyObject *cbs = _PyType_Lookup((PyTypeObject *)args[3], str_callbacks); /* borrowed */
    Py_XSETREF(c_future_callbacks, cbs != NULL && Py_IS_TYPE(cbs, &PyGetSetDescr_Type) ? Py_NewRef(cbs) : NULL);
    site_memo_clear(); /* another _sites */
    waits_ready = 1;
    Py_RETURN_NONE;
}

/* _note_wait(tt, task, start_ns, end_ns) -> bool: the C path of a long
 * wait, alone (tests compare it with the twin): True if it described the
 * wait, False if it left it to the twin. */
static PyObject *
note_wait_py(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    unsigned long long start, end;
    if (nargs != 4 || (start = PyLong_AsUnsignedLongLong(args[2])) == (unsigned long long)-1 ||
        (end = PyLong_AsUnsignedLongLong(args[3])) == (unsigned long long)-1) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "_note_wait(tt, task, start_ns, end_ns)");
        return NULL;
    }
    int r = note_wait_c(args[0], args[1], start, end);
    if (r < 0)
        return NULL;
    return PyBool_FromLong(r);
}

/* ------------------------------------------------------------------------ */
/* Module glue                                                                */
/* ------------------------------------------------------------------------ */

static Py_ssize_t
member_offset(PyObject *cls, const char *name)
{
    PyObject *d = PyObject_GetAttrString(cls, name);
    if (d == NULL)
        return -1;
    Py_ssize_t off = -1;
    if (Py_IS_TYPE(d, &PyMemberDescr_Type) && ((PyMemberDescrObject *)d)->d_member->type == T_OBJECT_EX)
        off = ((PyMemberDescrObject *)d)->d_member->offset;
    Py_DECREF(d);
    if (off < 0)
        PyErr_Format(PyExc_TypeError, "_tasks_setup: %R.%s is not a __slots__ member", cls, name);
    return off;
}

static PyObject *
tasks_setup(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 13 || !PyType_Check(args[0]) || !PyType_Check(args[2]) || !PyList_CheckExact(args[10])) {
        PyErr_SetString(PyExc_TypeError,
                        "_tasks_setup(TaskThread, attr, Task, PyTask, py_step, py_wakeup, first_scheduled, first_step, "
                        "task_done, eager_started, tracer_running, note_wait, long_wait_ns)");
        return NULL;
    }
    unsigned long long wait_ns = PyLong_AsUnsignedLongLong(args[12]);
    if (wait_ns == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    if (member_offsets(args[0], tt_slots, TT_COUNT, off_tt) < 0)
        return NULL;
    Py_XSETREF(task_thread_type, (PyTypeObject *)Py_NewRef(args[0]));
    Py_XSETREF(str_task_attr, Py_NewRef(args[1]));
    Py_XSETREF(c_task_type, Py_NewRef(args[2]));
    Py_XSETREF(c_task_done, PyObject_GetAttr(args[2], str_done)); /* the method descriptor */
    if (c_task_done == NULL)
        return NULL;
    Py_XSETREF(py_task_type, Py_NewRef(args[3]));
    Py_XSETREF(py_step_fn, Py_NewRef(args[4]));
    Py_XSETREF(py_wakeup_fn, Py_NewRef(args[5]));
    Py_XSETREF(on_first_scheduled, Py_NewRef(args[6]));
    Py_XSETREF(on_first_step, Py_NewRef(args[7]));
    Py_XSETREF(on_task_done, Py_NewRef(args[8]));
    Py_XSETREF(on_eager_step, Py_NewRef(args[9]));
    Py_XSETREF(tracer_running, Py_NewRef(args[10]));
    Py_XSETREF(on_long_wait, Py_NewRef(args[11]));
    long_wait_ns = (uint64_t)wait_ns;
    /* The C Task's attribute in its instance dict, read there: only if the
     * type has a plain dict offset and nothing of that name (a descriptor
     * would come first). */
    int in_type = PyObject_HasAttr(c_task_type, str_task_attr);
    Py_ssize_t off = ((PyTypeObject *)c_task_type)->tp_dictoffset;
    task_dict_offset = !in_type && off > 0 && !(((PyTypeObject *)c_task_type)->tp_flags & Py_TPFLAGS_MANAGED_DICT)
                           ? off
                           : 0;
    Py_RETURN_NONE;
}

static PyMethodDef tasks_functions[] = {
    {"_tasks_setup", (PyCFunction)(void (*)(void))tasks_setup, METH_FASTCALL,
     "Give the task hooks TaskThread, the task attribute name, the Task classes, the Python Task's step "
     "functions, the Python callbacks, the tracer's list of runs, and the long-wait callback and threshold."},
    {"_task_finish_setup", (PyCFunction)(void (*)(void))task_finish_setup, METH_FASTCALL,
     "Record a C Task's end in C (array type, typecode, NO_RECORDS, DISCARD_STEPS), or in Python (None)."},
    {"_task_create_setup", (PyCFunction)(void (*)(void))task_create_setup, METH_FASTCALL,
     "Record a new C Task spawned in a recorded step in C (see _asyncio), or in Python (None)."},
    {"_watch_eager", watch_eager, METH_O, "Watch asyncio's current-task table for eager steps (None: stop)."},
    {"await_key", await_key, METH_O, "The key of a suspended coroutine's await chain, and the awaitable at its bottom."},
    {"_states_setup", (PyCFunction)(void (*)(void))states_setup, METH_FASTCALL,
     "Find the profile that records a new C Task in C (RF_STATE, EMPTY_RF_STATE, RFState, Recorder, "
     "global_task_recorders), or in Python (None)."},
    {"_states_in", (PyCFunction)states_in_py, METH_O,
     "_tasks.states_in's C path alone: the profile, None, or NotImplemented when it is the twin's."},
    {"_waits_setup", (PyCFunction)(void (*)(void))waits_setup, METH_FASTCALL,
     "Describe the long waits of C Tasks in C (WaitLog, sites, wait_at, Future), or in Python (None)."},
    {"_note_wait", (PyCFunction)(void (*)(void))note_wait_py, METH_FASTCALL,
     "A long wait described by the C path alone: True, or False when it is the Python twin's."},
    {"_task_layout", task_layout_view, METH_NOARGS,
     "What the C paths learnt of the C Task's fields: (coroutine's offset or 0, name checks left, waiter checks "
     "left, whether one disagreed)."},
    {NULL, NULL, 0, NULL},
};

int
aprof_tasks_init(PyObject *module)
{
    str_self = PyUnicode_InternFromString("__self__");
    str_done = PyUnicode_InternFromString("done");
    str_append = PyUnicode_InternFromString("append");
    if (str_self == NULL || str_done == NULL || str_append == NULL)
        return -1;
    str_exception = PyUnicode_InternFromString("_exception");
    str_runs = PyUnicode_InternFromString("runs");
    str_lists = PyUnicode_InternFromString("lists");
    if (str_lists == NULL)
        return -1;
    str_returned = PyUnicode_InternFromString("returned");
    str_cancelled = PyUnicode_InternFromString("cancelled");
    str_cancelled_error = PyUnicode_InternFromString("CancelledError");
    str_task_fallback = PyUnicode_InternFromString("Task");
    str_asyncio = PyUnicode_InternFromString("asyncio");
    str_qualname = PyUnicode_InternFromString("__qualname__");
    str_budget = PyUnicode_InternFromString("budget");
    str_admit = PyUnicode_InternFromString("admit");
    str_task_records = PyUnicode_InternFromString("task_records");
    str_run_coro = PyUnicode_InternFromString("run_coro");
    str_get_coro = PyUnicode_InternFromString("get_coro");
    if (str_asyncio == NULL || str_qualname == NULL ||
        str_budget == NULL || str_admit == NULL || str_task_records == NULL || str_run_coro == NULL ||
        str_get_coro == NULL)
        return -1;
    if (str_exception == NULL || str_runs == NULL || str_returned == NULL ||
        str_cancelled == NULL || str_cancelled_error == NULL || str_task_fallback == NULL)
        return -1;
    str_cr_await = PyUnicode_InternFromString("cr_await");
    str_cr_code = PyUnicode_InternFromString("cr_code");
    str_cr_frame = PyUnicode_InternFromString("cr_frame");
    str_gi_yieldfrom = PyUnicode_InternFromString("gi_yieldfrom");
    str_gi_code = PyUnicode_InternFromString("gi_code");
    str_gi_frame = PyUnicode_InternFromString("gi_frame");
    str_ag_code = PyUnicode_InternFromString("ag_code");
    if (str_cr_await == NULL || str_gi_yieldfrom == NULL)
        return -1;
    coro_await_descr = Py_XNewRef(_PyType_Lookup(&PyCoro_Type, str_cr_await));
    gen_yf_descr = Py_XNewRef(_PyType_Lookup(&PyGen_Type, str_gi_yieldfrom));
    str_get = PyUnicode_InternFromString("get");
    str_call_soon = PyUnicode_InternFromString("call_soon");
    if (str_get == NULL || str_call_soon == NULL)
        return -1;
    str_fut_waiter = PyUnicode_InternFromString("_fut_waiter");
    str_children = PyUnicode_InternFromString("_children");
    str_callbacks = PyUnicode_InternFromString("_callbacks");
    str_chain_future = PyUnicode_InternFromString("_chain_future");
    str_add = PyUnicode_InternFromString("add");
    str_kind_task = PyUnicode_InternFromString("task");
    str_kind_executor = PyUnicode_InternFromString("executor");
    str_kind_future = PyUnicode_InternFromString("future");
    str_a_future = PyUnicode_InternFromString("a future");
    str_executor_job = PyUnicode_InternFromString("an executor job (run_in_executor)");
    str_unnamed = PyUnicode_InternFromString("?");
    str_task_open = PyUnicode_InternFromString("task ");
    str_paren_open = PyUnicode_InternFromString(" (");
    str_paren_close = PyUnicode_InternFromString(")");
    str_empty = PyUnicode_InternFromString("");
    if (str_task_open == NULL || str_paren_open == NULL || str_paren_close == NULL || str_empty == NULL)
        return -1;
    if (str_fut_waiter == NULL || str_children == NULL || str_callbacks == NULL || str_chain_future == NULL ||
        str_add == NULL || str_kind_task == NULL || str_kind_executor == NULL ||
        str_kind_future == NULL || str_a_future == NULL || str_executor_job == NULL || str_unnamed == NULL)
        return -1;
    leaf_types = PySet_New(NULL);
    if (str_cr_await == NULL || str_cr_code == NULL || str_cr_frame == NULL || str_gi_yieldfrom == NULL ||
        str_gi_code == NULL || str_gi_frame == NULL || str_ag_code == NULL || leaf_types == NULL)
        return -1;
    if ((empty_args = PyTuple_New(0)) == NULL)
        return -1;
    if (PyType_Ready(&StepLogType) < 0 || PyType_Ready(&TaskRecordType) < 0 || PyType_Ready(&WaitLogType) < 0 ||
        PyType_Ready(&StepCallType) < 0 || PyType_Ready(&CallSoonHookType) < 0 ||
        PyType_Ready(&AddHookType) < 0)
        return -1;
    if (PyModule_AddObjectRef(module, "StepLog", (PyObject *)&StepLogType) < 0 ||
        PyModule_AddObjectRef(module, "TaskRecord", (PyObject *)&TaskRecordType) < 0 ||
        PyModule_AddObjectRef(module, "WaitLog", (PyObject *)&WaitLogType) < 0 ||
        PyModule_AddObjectRef(module, "StepCall", (PyObject *)&StepCallType) < 0 ||
        PyModule_AddObjectRef(module, "CallSoonHook", (PyObject *)&CallSoonHookType) < 0 ||
        PyModule_AddObjectRef(module, "AddHook", (PyObject *)&AddHookType) < 0)
        return -1;
    return PyModule_AddFunctions(module, tasks_functions);
}
