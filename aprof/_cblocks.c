/*
 * Range blocks: the raw records of plain ranges, packed (issue 17 item 4).
 *
 * A range recorded by a fast path (aprof.record_function with nothing but a
 * name and maybe args, or a call the tracer's replay rebuilds) used to be two
 * tuples in its logical thread's raw list: a start tuple and an end tuple
 * naming the start's index, about 270 bytes held until stop. A RangeBlock
 * holds a run of such ranges as 48-byte C structs. It sits in the raw list
 * like any other record (the list keeps the order of everything else that
 * thread recorded); a range opens by taking the next slot of the block at
 * the list's tail (a new block is appended when the tail is something else),
 * and ends by writing its end into that slot: nothing is appended.
 *
 * A block holds only strs (names, args, exception names), so it is not a
 * GC container: the collector never walks the ranges. Consolidation at stop
 * (_cevents.c, consolidate) reads the slots straight into the columns.
 */
#define PY_SSIZE_T_CLEAN
#include "_cext.h"
#include <structmember.h>

static void
RangeBlock_dealloc(RangeBlock *self)
{
    for (Py_ssize_t i = 0; i < self->n; i++) {
        BlockSlot *s = &self->slots[i];
        Py_XDECREF(s->name);
        Py_XDECREF(s->args);
        Py_XDECREF(s->exc);
    }
    PyMem_Free(self->slots);
    Py_XDECREF(self->scope);
    Py_XDECREF(self->owner_name);
    Py_XDECREF(self->owner_kind);
    Py_XDECREF(self->owner_os_tid);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

RangeBlock *
aprof_block_new(PyObject *scope)
{
    RangeBlock *b = PyObject_New(RangeBlock, &RangeBlockType);
    if (b == NULL)
        return NULL;
    b->scope = Py_NewRef(scope);
    b->n = b->cap = 0;
    b->slots = NULL;
    b->owner = 0;
    b->owner_name = b->owner_kind = b->owner_os_tid = NULL;
    b->at = -1;
    return b;
}

void
aprof_block_own(RangeBlock *b, int64_t owner, PyObject *name, PyObject *kind, PyObject *os_tid)
{
    b->owner = owner;
    Py_XSETREF(b->owner_name, Py_XNewRef(name));
    Py_XSETREF(b->owner_kind, Py_XNewRef(kind));
    Py_XSETREF(b->owner_os_tid, Py_XNewRef(os_tid));
}

/* Room for one more slot: the capacity grows by a quarter (16 at least), so
 * the slack a block carries stays small against the 48 bytes a range takes,
 * and appends stay amortised constant time. */
static int
block_reserve(RangeBlock *b)
{
    if (b->n < b->cap)
        return 0;
    Py_ssize_t cap = b->cap + (b->cap >> 2);
    if (cap < b->cap + 16)
        cap = b->owner != 0 && b->cap == 0 ? 4 : b->cap + 16; /* a task's block: a few ranges, most often */
    if ((size_t)cap > PY_SSIZE_T_MAX / sizeof(BlockSlot)) {
        PyErr_NoMemory();
        return -1;
    }
    BlockSlot *slots = PyMem_Realloc(b->slots, (size_t)cap * sizeof(BlockSlot));
    if (slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->slots = slots;
    b->cap = cap;
    return 0;
}

Py_ssize_t
aprof_block_open(RangeBlock *b, PyObject *name, PyObject *args)
{
    if (block_reserve(b) < 0)
        return -1;
    Py_ssize_t i = b->n++;
    BlockSlot *s = &b->slots[i];
    s->name = Py_NewRef(name);
    s->args = args == Py_None ? NULL : Py_XNewRef(args);
    s->exc = NULL;
    s->start = 0;
    s->end = BLOCK_OPEN;
    s->end_tid = 0;
    return i;
}

void
aprof_block_close(RangeBlock *b, Py_ssize_t i, int64_t end, int64_t end_tid, PyObject *exc)
{
    assert(exc == NULL || exc == Py_None || PyUnicode_CheckExact(exc));
    if (i < 0 || i >= b->n)
        return;
    BlockSlot *s = &b->slots[i];
    if (s->end != BLOCK_OPEN)
        return; /* a second end: the first one stands, as with end tuples */
    s->end = end;
    s->end_tid = end_tid;
    if (exc != NULL && exc != Py_None)
        Py_XSETREF(s->exc, Py_NewRef(exc));
}

/* A block made from Python: RangeBlock(scope) (tests, and the pure-Python
 * path's parity checks). */
static PyObject *
RangeBlock_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *scope;
    if (!PyArg_ParseTuple(args, "U:RangeBlock", &scope))
        return NULL;
    if (!PyUnicode_CheckExact(scope)) { /* a block holds exact strs only: it is no GC container */
        PyErr_SetString(PyExc_TypeError, "RangeBlock(scope): scope must be a str, not a subclass");
        return NULL;
    }
    if (kwds != NULL && PyDict_GET_SIZE(kwds) > 0) {
        PyErr_SetString(PyExc_TypeError, "RangeBlock() takes no keyword arguments");
        return NULL;
    }
    return (PyObject *)aprof_block_new(scope);
}

static PyObject *
RangeBlock_open(RangeBlock *self, PyObject *const *args, Py_ssize_t nargs)
{
    long long start;
    if (nargs != 3 || !PyUnicode_CheckExact(args[0]) || (args[1] != Py_None && !PyUnicode_CheckExact(args[1])) ||
        !PyLong_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "RangeBlock.open(name: str, args: str | None, start: int)");
        return NULL;
    }
    if ((start = PyLong_AsLongLong(args[2])) == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t i = aprof_block_open(self, args[0], args[1]);
    if (i < 0)
        return NULL;
    self->slots[i].start = start;
    return PyLong_FromSsize_t(i);
}

static PyObject *
RangeBlock_close(RangeBlock *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t i;
    long long end, tid;
    if (nargs != 4 || (args[3] != Py_None && !PyUnicode_CheckExact(args[3]))) {
        PyErr_SetString(PyExc_TypeError, "RangeBlock.close(index: int, end: int, end_thread_id: int, exc: str | None)");
        return NULL;
    }
    if ((i = PyLong_AsSsize_t(args[0])) == -1 && PyErr_Occurred())
        return NULL;
    if ((end = PyLong_AsLongLong(args[1])) == -1 && PyErr_Occurred())
        return NULL;
    if ((tid = PyLong_AsLongLong(args[2])) == -1 && PyErr_Occurred())
        return NULL;
    if (i < 0 || i >= self->n) {
        PyErr_Format(PyExc_IndexError, "RangeBlock.close: no slot %zd in a block of %zd", i, self->n);
        return NULL;
    }
    aprof_block_close(self, i, end, tid, args[3]);
    Py_RETURN_NONE;
}

/* own(owner, name, kind, os_thread_id): make it a block of TASK_BLOCKS,
 * task `owner`'s (tests; the fast path does it in C). */
static PyObject *
RangeBlock_own_py(RangeBlock *self, PyObject *const *args, Py_ssize_t nargs)
{
    long long owner;
    if (nargs != 4 || !PyLong_Check(args[0]) || !PyUnicode_CheckExact(args[1]) || !PyUnicode_CheckExact(args[2]) ||
        !PyLong_CheckExact(args[3])) {
        PyErr_SetString(PyExc_TypeError, "RangeBlock.own(owner: int, name: str, kind: str, os_thread_id: int)");
        return NULL;
    }
    if ((owner = PyLong_AsLongLong(args[0])) == -1 && PyErr_Occurred())
        return NULL;
    if (owner <= 0) {
        PyErr_SetString(PyExc_ValueError, "RangeBlock.own: owner must be a logical thread id (> 0)");
        return NULL;
    }
    aprof_block_own(self, owner, args[1], args[2], args[3]);
    Py_RETURN_NONE;
}

/* rows() -> [(name, scope, start, args, end or None, end_thread_id, exc)]:
 * the slots as Python values, for the pure-Python consolidation path. */
static PyObject *
RangeBlock_rows(RangeBlock *self, PyObject *Py_UNUSED(ignored))
{
    Py_ssize_t n = self->n; /* once: a finalizer run by the loop's allocations may open a slot */
    PyObject *out = PyList_New(n);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        BlockSlot *s = &self->slots[i];
        PyObject *row;
        if (s->end == BLOCK_OPEN)
            row = Py_BuildValue("(OOLOOLO)", s->name, self->scope, (long long)s->start, s->args ? s->args : Py_None,
                                Py_None, (long long)0, Py_None);
        else
            row = Py_BuildValue("(OOLOLLO)", s->name, self->scope, (long long)s->start, s->args ? s->args : Py_None,
                                (long long)s->end, (long long)s->end_tid, s->exc ? s->exc : Py_None);
        if (row == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, row);
    }
    return out;
}

static PyObject *
RangeBlock_sizeof(RangeBlock *self, PyObject *Py_UNUSED(ignored))
{
    return PyLong_FromSize_t(sizeof(RangeBlock) + (size_t)self->cap * sizeof(BlockSlot));
}

static Py_ssize_t
RangeBlock_len(RangeBlock *self)
{
    return self->n;
}

static PyObject *
RangeBlock_repr(RangeBlock *self)
{
    return PyUnicode_FromFormat("<RangeBlock %R: %zd ranges>", self->scope, self->n);
}

static PyMethodDef RangeBlock_methods[] = {
    {"open", (PyCFunction)(void (*)(void))RangeBlock_open, METH_FASTCALL,
     "open(name, args, start) -> index: a range that starts."},
    {"close", (PyCFunction)(void (*)(void))RangeBlock_close, METH_FASTCALL,
     "close(index, end, end_thread_id, exc): the range at index ends (a second end is ignored)."},
    {"own", (PyCFunction)(void (*)(void))RangeBlock_own_py, METH_FASTCALL,
     "own(owner, name, kind, os_thread_id): a block of TASK_BLOCKS, the ranges of task `owner`."},
    {"rows", (PyCFunction)RangeBlock_rows, METH_NOARGS,
     "rows() -> [(name, scope, start, args, end or None, end_thread_id, exc)]."},
    {"__sizeof__", (PyCFunction)RangeBlock_sizeof, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef RangeBlock_members[] = {
    {"scope", T_OBJECT, offsetof(RangeBlock, scope), READONLY, "The scope value of every range in the block."},
    {"owner", T_LONGLONG, offsetof(RangeBlock, owner), READONLY,
     "The id of the task's logical thread whose ranges these are (a block of TASK_BLOCKS), else 0."},
    {"owner_name", T_OBJECT, offsetof(RangeBlock, owner_name), READONLY, "That task's name when the block was made."},
    {"owner_kind", T_OBJECT, offsetof(RangeBlock, owner_kind), READONLY, "That task's kind (asyncio, trio)."},
    {"owner_os_tid", T_OBJECT, offsetof(RangeBlock, owner_os_tid), READONLY, "That task's OS thread id."},
    {NULL},
};

static PySequenceMethods RangeBlock_as_sequence = {
    .sq_length = (lenfunc)RangeBlock_len,
};

PyTypeObject RangeBlockType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "aprof._ctracer.RangeBlock",
    .tp_basicsize = sizeof(RangeBlock),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "RangeBlock(scope)\n--\n\nPacked raw ranges of one scope (see aprof/_cblocks.c).",
    .tp_new = RangeBlock_new,
    .tp_dealloc = (destructor)RangeBlock_dealloc,
    .tp_repr = (reprfunc)RangeBlock_repr,
    .tp_methods = RangeBlock_methods,
    .tp_members = RangeBlock_members,
    .tp_as_sequence = &RangeBlock_as_sequence,
};

/* ------------------------------------------------------------------------ */
/* Budget: a profile's memory budget (issue 19)                              */
/* ------------------------------------------------------------------------ */

/* Every recording path takes room in the budget before it records (the C
 * range fast path inline, the Python paths through take()). Taking is a
 * count and a compare; when the count reaches the limit, on_full (Python,
 * aprof._core._ring) runs once: it rotates the ring (keep the latest: the
 * oldest generation of records is let go) or fills the budget (keep the
 * first: `full` is set and every later record is dropped and counted here,
 * by kind). */

int
aprof_budget_take(Budget *b, int kind, Py_ssize_t n)
{
    if (b->full) {
        b->dropped[kind] += n;
        return 1;
    }
    b->count += n;
    if (APROF_UNLIKELY(b->count >= b->limit) && !b->in_full && b->on_full != NULL) {
        b->in_full = 1;
#if PY_VERSION_HEX >= 0x030C0000
        PyObject *exc = PyErr_GetRaisedException();
#else
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
#endif
        PyObject *r = PyObject_CallNoArgs(b->on_full);
        b->in_full = 0;
        if (r == NULL && !PyErr_ExceptionMatches(PyExc_Exception)) {
            /* A KeyboardInterrupt or SystemExit meant for the program: it
             * goes on (the exception that was pending before is dropped). */
#if PY_VERSION_HEX >= 0x030C0000
            Py_XDECREF(exc);
#else
            Py_XDECREF(et);
            Py_XDECREF(ev);
            Py_XDECREF(tb);
#endif
            return -1;
        }
        if (r == NULL) /* aprof's bug: never into the program (on_full warns itself first) */
            PyErr_Clear();
        Py_XDECREF(r);
#if PY_VERSION_HEX >= 0x030C0000
        PyErr_SetRaisedException(exc);
#else
        PyErr_Restore(et, ev, tb);
#endif
    }
    return 0; /* the record that reaches the limit is kept, even if on_full filled the budget */
}

static PyObject *
Budget_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *on_full;
    Py_ssize_t limit;
    static char *kwlist[] = {"on_full", "limit", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "On:Budget", kwlist, &on_full, &limit))
        return NULL;
    if (!PyCallable_Check(on_full) || limit < 1) {
        PyErr_SetString(PyExc_ValueError, "Budget(on_full: callable, limit: int >= 1)");
        return NULL;
    }
    Budget *b = (Budget *)type->tp_alloc(type, 0);
    if (b == NULL)
        return NULL;
    b->on_full = Py_NewRef(on_full);
    b->limit = limit;
    return (PyObject *)b;
}

static int
Budget_traverse(Budget *b, visitproc visit, void *arg)
{
    Py_VISIT(b->on_full);
    return 0;
}

static int
Budget_clear(Budget *b)
{
    Py_CLEAR(b->on_full);
    return 0;
}

static void
Budget_dealloc(Budget *b)
{
    PyObject_GC_UnTrack(b);
    Budget_clear(b);
    Py_TYPE(b)->tp_free((PyObject *)b);
}

/* take(kind, n=1) -> bool: whether to record n records of kind (0 range,
 * 1 instant, 2 task, 3 step). */
static PyObject *
Budget_take(Budget *b, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t kind, n = 1;
    if (nargs < 1 || nargs > 2 || (kind = PyLong_AsSsize_t(args[0])) == -1 ||
        (nargs == 2 && (n = PyLong_AsSsize_t(args[1])) == -1)) {
        if (!PyErr_Occurred() || PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Clear();
            PyErr_SetString(PyExc_TypeError, "Budget.take(kind: int, n: int = 1)");
        }
        return NULL;
    }
    if (kind < 0 || kind > 3 || n < 0) {
        PyErr_Format(PyExc_ValueError, "Budget.take: kind %zd or n %zd out of range", kind, n);
        return NULL;
    }
    int r = aprof_budget_take(b, (int)kind, n);
    return r < 0 ? NULL : PyBool_FromLong(r == 0);
}

static PyObject *
Budget_get_dropped(Budget *b, void *closure)
{
    return Py_BuildValue("(nnnn)", b->dropped[0], b->dropped[1], b->dropped[2], b->dropped[3]);
}

static PyObject *
Budget_get_full(Budget *b, void *closure)
{
    return PyBool_FromLong(b->full);
}

static int
Budget_set_full(Budget *b, PyObject *v, void *closure)
{
    int t = v == NULL ? -1 : PyObject_IsTrue(v);
    if (t < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "Budget.full cannot be deleted");
        return -1;
    }
    b->full = t;
    return 0;
}

static PyMethodDef Budget_methods[] = {
    {"take", (PyCFunction)(void (*)(void))Budget_take, METH_FASTCALL,
     "take(kind, n=1) -> bool: room for n records of kind (0 range, 1 instant, 2 task, 3 step)?"},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef Budget_members[] = {
    {"count", T_PYSSIZET, offsetof(Budget, count), 0, "Records taken since on_full last ran."},
    {"limit", T_PYSSIZET, offsetof(Budget, limit), 0, "on_full runs when count reaches this."},
    {NULL},
};

static PyGetSetDef Budget_getset[] = {
    {"dropped", (getter)Budget_get_dropped, NULL, "Dropped while full: (ranges, instants, tasks, steps).", NULL},
    {"full", (getter)Budget_get_full, (setter)Budget_set_full, "Keep the first: drop every later record.", NULL},
    {NULL},
};

PyTypeObject BudgetType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "aprof._ctracer.Budget",
    .tp_basicsize = sizeof(Budget),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Budget(on_full, limit)\n--\n\nA profile's memory budget (see aprof/_cblocks.c).",
    .tp_new = Budget_new,
    .tp_dealloc = (destructor)Budget_dealloc,
    .tp_traverse = (traverseproc)Budget_traverse,
    .tp_clear = (inquiry)Budget_clear,
    .tp_methods = Budget_methods,
    .tp_members = Budget_members,
    .tp_getset = Budget_getset,
};

/* ------------------------------------------------------------------------ */
/* What a generation of raw records holds                                    */
/* ------------------------------------------------------------------------ */

/* The bytes a str held by a record costs the ring: its size if the record is
 * all that holds it (an args string made for the range), else nothing (a
 * name the program holds anyway). */
static size_t
owned_str_bytes(PyObject *s)
{
    if (s == NULL || !PyUnicode_Check(s) || Py_REFCNT(s) != 1)
        return 0;
    return sizeof(PyASCIIObject) + 8 + (size_t)PyUnicode_GET_LENGTH(s) * PyUnicode_KIND(s);
}

#define GC_HEAD_BYTES 16
#define INT_BYTES 32 /* a perf_counter_ns value: two 30-bit digits */

/* What raw list lst's records hold, trimming every block's spare capacity
 * first (a sealed generation takes no new slots; ends of ranges still open
 * are written into the slots they have). */
static size_t
seal_list(PyObject *lst)
{
    Py_ssize_t n = PyList_GET_SIZE(lst);
    size_t bytes = sizeof(PyListObject) + GC_HEAD_BYTES + (size_t)n * sizeof(PyObject *);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *t = PyList_GET_ITEM(lst, i);
        if (RangeBlock_Check(t)) {
            RangeBlock *b = (RangeBlock *)t;
            if (b->cap > b->n && b->n > 0) {
                BlockSlot *slots = PyMem_Realloc(b->slots, (size_t)b->n * sizeof(BlockSlot));
                if (slots != NULL) {
                    b->slots = slots;
                    b->cap = b->n;
                }
            }
            bytes += sizeof(RangeBlock) + (size_t)b->cap * sizeof(BlockSlot);
            for (Py_ssize_t k = 0; k < b->n; k++)
                bytes += owned_str_bytes(b->slots[k].args) + owned_str_bytes(b->slots[k].exc);
        }
        else if (PyTuple_CheckExact(t)) {
            Py_ssize_t size = PyTuple_GET_SIZE(t);
            bytes += sizeof(PyTupleObject) + GC_HEAD_BYTES + (size_t)(size - 1) * sizeof(PyObject *);
            for (Py_ssize_t k = 0; k < size; k++) {
                PyObject *v = PyTuple_GET_ITEM(t, k);
                if (PyLong_CheckExact(v) && Py_REFCNT(v) == 1)
                    bytes += INT_BYTES;
                else
                    bytes += owned_str_bytes(v);
            }
        }
        else
            bytes += 64; /* an object of another kind: a guess, none are expected */
    }
    return bytes;
}

/* raw_seal(lst) -> bytes: what a raw list's records hold (seal_list). */
static PyObject *
raw_seal(PyObject *module, PyObject *lst)
{
    if (!PyList_CheckExact(lst)) {
        PyErr_SetString(PyExc_TypeError, "raw_seal(lst: list)");
        return NULL;
    }
    return PyLong_FromSize_t(seal_list(lst));
}

/* ring_seal(lists) -> bytes: seal_list for each raw list of a ring's sealed
 * generation, and take each list out of the garbage collector's lists. A
 * raw list holds records (blocks, and tuples of strs, ints and None, or of
 * those and a stack tuple) and nothing it holds refers back to it, so it
 * can never be part of a cycle; a ring full of a server's tasks holds a
 * list for each task, and every full collection would walk them all (the
 * pause a request sees: issue 19). */
static PyObject *
ring_seal(PyObject *module, PyObject *lists)
{
    if (!PyList_CheckExact(lists)) {
        PyErr_SetString(PyExc_TypeError, "ring_seal(lists: list[list])");
        return NULL;
    }
    size_t bytes = 0;
    for (Py_ssize_t j = 0; j < PyList_GET_SIZE(lists); j++) {
        PyObject *lst = PyList_GET_ITEM(lists, j);
        if (!PyList_CheckExact(lst)) {
            PyErr_SetString(PyExc_TypeError, "ring_seal(lists: list[list])");
            return NULL;
        }
        bytes += seal_list(lst);
        if (PyObject_GC_IsTracked(lst))
            PyObject_GC_UnTrack(lst);
    }
    return PyLong_FromSize_t(bytes);
}

/* The bytes `sys.getsizeof(o)` gives: the object's __sizeof__ (a tuple's
 * and a TaskRecord's without a call), and the GC's header for a GC type. */
static Py_ssize_t
size_of(PyObject *o)
{
    Py_ssize_t head = PyObject_IS_GC(o) ? GC_HEAD_BYTES : 0;
#ifdef Py_TPFLAGS_MANAGED_DICT /* the pre-header of an instance's dict (and weakrefs): sys.getsizeof counts it */
    unsigned long managed = Py_TPFLAGS_MANAGED_DICT;
#ifdef Py_TPFLAGS_MANAGED_WEAKREF
    managed |= Py_TPFLAGS_MANAGED_WEAKREF;
#endif
    if (Py_TYPE(o)->tp_flags & managed)
        head += 2 * (Py_ssize_t)sizeof(PyObject *);
#endif
    if (PyTuple_CheckExact(o))
        return (Py_ssize_t)sizeof(PyTupleObject) + head + (PyTuple_GET_SIZE(o) - 1) * (Py_ssize_t)sizeof(PyObject *);
    if (Py_IS_TYPE(o, &TaskRecordType))
        return (Py_ssize_t)sizeof(TaskRecord);
    PyObject *r = PyObject_CallMethod(o, "__sizeof__", NULL);
    if (r == NULL)
        return -1;
    Py_ssize_t n = PyLong_AsSsize_t(r);
    Py_DECREF(r);
    return n < 0 ? -1 : n + head;
}

/* Whether o is an exact array.array (it holds numbers, no objects). */
static int
is_array(PyObject *o)
{
    return strcmp(Py_TYPE(o)->tp_name, "array.array") == 0;
}

/* ring_records(records) -> (bytes, steps, running): what task records of a
 * ring's sealed generation hold (the record and its steps, as
 * sys.getsizeof measures them), the steps of those finished (a finished
 * task's record, a TaskRecord or the twin's tuple, holds its steps, an
 * array or a StepLog, at TASK_RECORD_STEPS), and the indices of those
 * still running (a running task's record is its object, with a `steps`
 * attribute: counted when the generation goes). A finished record's steps
 * array is then taken out of the garbage collector's lists (it holds no
 * objects), and so is a twin's tuple that holds only untracked ones (what
 * CPython's collector does for such a tuple itself, but only once a
 * collection looks at it; see ring_seal); a TaskRecord never is on them. */
static PyObject *
ring_records(PyObject *module, PyObject *records)
{
    if (!PyList_CheckExact(records)) {
        PyErr_SetString(PyExc_TypeError, "ring_records(records: list)");
        return NULL;
    }
    PyObject *running = PyList_New(0);
    if (running == NULL)
        return NULL;
    Py_ssize_t bytes = 0, steps = 0;
    /* Python code (__sizeof__, a running record's `steps`) may run: the list
     * is read by index with its size checked each time. */
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(records); i++) {
        PyObject *rec = Py_NewRef(PyList_GET_ITEM(records, i)), *s;
        PyObject *const *fields = aprof_record_fields(rec);
        int finished = fields != NULL;
        if (finished)
            s = Py_NewRef(fields[TASK_RECORD_STEPS]);
        else {
            PyObject *idx = PyLong_FromSsize_t(i);
            int err = idx == NULL || PyList_Append(running, idx) < 0;
            Py_XDECREF(idx);
            if (err || (s = PyObject_GetAttrString(rec, "steps")) == NULL)
                goto fail_rec;
        }
        Py_ssize_t rb = size_of(rec), sb = size_of(s), len = finished ? PyObject_Size(s) : 0;
        if (rb < 0 || sb < 0 || len < 0) {
            Py_DECREF(s);
            goto fail_rec;
        }
        bytes += rb + sb;
        steps += (len + 1) / 2;
        if (finished && is_array(s) && PyObject_GC_IsTracked(s))
            PyObject_GC_UnTrack(s);
        if (finished && PyObject_IS_GC(rec) && PyObject_GC_IsTracked(rec)) { /* the twin's tuple */
            int k = 0;
            for (; k < TASK_RECORD_LEN; k++) {
                PyObject *v = fields[k];
                if (PyObject_IS_GC(v) && PyObject_GC_IsTracked(v))
                    break;
            }
            if (k == TASK_RECORD_LEN)
                PyObject_GC_UnTrack(rec);
        }
        Py_DECREF(s);
        Py_DECREF(rec);
        continue;
    fail_rec:
        Py_DECREF(rec);
        Py_DECREF(running);
        return NULL;
    }
    return Py_BuildValue("(nnN)", bytes, steps, running);
}

/* The events raw list lst records, added to *ranges and *instants (a
 * range's end tuple is part of its range). */
static void
count_list(PyObject *lst, Py_ssize_t *ranges, Py_ssize_t *instants)
{
    Py_ssize_t n = PyList_GET_SIZE(lst);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *t = PyList_GET_ITEM(lst, i);
        if (RangeBlock_Check(t))
            *ranges += ((RangeBlock *)t)->n;
        else if (PyTuple_Check(t) && PyTuple_GET_SIZE(t) >= 4 && !PyLong_CheckExact(PyTuple_GET_ITEM(t, 0))) {
            PyObject *kind = PyTuple_GET_SIZE(t) == 10 ? PyTuple_GET_ITEM(t, 8) : NULL;
            if (kind != NULL && PyLong_CheckExact(kind) && PyLong_AsLong(kind) == 1) /* KIND_INSTANT */
                (*instants)++;
            else
                (*ranges)++;
        }
    }
}

/* raw_counts(lst) -> (ranges, instants): the events a raw list records. */
static PyObject *
raw_counts(PyObject *module, PyObject *lst)
{
    if (!PyList_CheckExact(lst)) {
        PyErr_SetString(PyExc_TypeError, "raw_counts(lst: list)");
        return NULL;
    }
    Py_ssize_t ranges = 0, instants = 0;
    count_list(lst, &ranges, &instants);
    return Py_BuildValue("(nn)", ranges, instants);
}

/* ring_counts(lists, records) -> (ranges, instants, tasks, steps, running):
 * what a ring's generation holds (lists: its dict of raw lists), counted exactly when the ring lets it go
 * (aprof/_core/_ring.py): the events of its raw lists, its task records and
 * their steps (a finished task's record holds its steps at
 * TASK_RECORD_STEPS; a running task's is its object, with a `steps`
 * attribute), and the running ones, which the ring tells it let go. One
 * pass in C: a generation of a server's ring holds tens of thousands of
 * lists and records, and this runs in the rotation. */
static PyObject *
ring_counts(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyDict_CheckExact(args[0]) || !PyList_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "ring_counts(lists: dict[lt, list], records: list)");
        return NULL;
    }
    PyObject *lists = args[0], *records = args[1], *key, *lst;
    Py_ssize_t ranges = 0, instants = 0, steps = 0, pos = 0;
    /* The dict's values in place (no list of them made: touching each
     * list's reference count costs as much as counting it). */
    while (PyDict_Next(lists, &pos, &key, &lst)) {
        if (!PyList_CheckExact(lst)) {
            PyErr_SetString(PyExc_TypeError, "ring_counts(lists: dict[lt, list], records: list)");
            return NULL;
        }
        count_list(lst, &ranges, &instants);
    }
    PyObject *running = PyList_New(0);
    if (running == NULL)
        return NULL;
    /* Python code (a running record's `steps`) may run: the records list is
     * read by index with its size checked each time. */
    Py_ssize_t tasks = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(records); i++) {
        PyObject *rec = Py_NewRef(PyList_GET_ITEM(records, i)), *s;
        tasks++;
        PyObject *const *fields = aprof_record_fields(rec);
        if (fields != NULL)
            s = Py_NewRef(fields[TASK_RECORD_STEPS]);
        else {
            if (PyList_Append(running, rec) < 0 || (s = PyObject_GetAttrString(rec, "steps")) == NULL) {
                Py_DECREF(rec);
                Py_DECREF(running);
                return NULL;
            }
        }
        Py_DECREF(rec);
        Py_ssize_t len = PyObject_Size(s);
        Py_DECREF(s);
        if (len < 0) {
            Py_DECREF(running);
            return NULL;
        }
        steps += (len + 1) / 2;
    }
    return Py_BuildValue("(nnnnN)", ranges, instants, tasks, steps, running);
}

/* A copy of block b as it is now (its slots, their references taken). */
static PyObject *
block_copy(RangeBlock *b)
{
    RangeBlock *c = aprof_block_new(b->scope);
    if (c == NULL)
        return NULL;
    Py_ssize_t n = b->n;
    if (n > 0) {
        c->slots = PyMem_Malloc((size_t)n * sizeof(BlockSlot));
        if (c->slots == NULL) {
            Py_DECREF(c);
            return PyErr_NoMemory();
        }
        memcpy(c->slots, b->slots, (size_t)n * sizeof(BlockSlot));
        for (Py_ssize_t k = 0; k < n; k++) {
            Py_XINCREF(c->slots[k].name);
            Py_XINCREF(c->slots[k].args);
            Py_XINCREF(c->slots[k].exc);
        }
        c->n = c->cap = n;
    }
    aprof_block_own(c, b->owner, b->owner_name, b->owner_kind, b->owner_os_tid);
    return (PyObject *)c;
}

/* raw_snapshot(lists) -> copies: each raw list as it is now, its blocks
 * copied (a range that ends later stays open in the copy), in one call, so
 * that no thread records in between (a flight recorder's dump, issue 19;
 * the caller pauses the cyclic GC, whose finalizers could run Python). */
static PyObject *
raw_snapshot(PyObject *module, PyObject *lists)
{
    if (!PyList_CheckExact(lists)) {
        PyErr_SetString(PyExc_TypeError, "raw_snapshot(lists: list[list])");
        return NULL;
    }
    Py_ssize_t nl = PyList_GET_SIZE(lists);
    PyObject *out = PyList_New(nl);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t j = 0; j < nl; j++) {
        PyObject *lst = PyList_GET_ITEM(lists, j);
        if (!PyList_CheckExact(lst)) {
            PyErr_SetString(PyExc_TypeError, "raw_snapshot(lists: list[list])");
            goto fail;
        }
        Py_ssize_t n = PyList_GET_SIZE(lst);
        PyObject *copy = PyList_New(n);
        if (copy == NULL)
            goto fail;
        PyList_SET_ITEM(out, j, copy);
        int plain = 1; /* nothing in it is on the cyclic GC's lists */
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *t = PyList_GET_ITEM(lst, i);
            PyObject *c = RangeBlock_Check(t) ? block_copy((RangeBlock *)t) : Py_NewRef(t);
            if (c == NULL)
                goto fail;
            PyList_SET_ITEM(copy, i, c);
            if (plain && PyObject_IS_GC(c) && PyObject_GC_IsTracked(c))
                plain = 0;
        }
        /* A copy of blocks and plain records leads no cycle: off the GC's
         * lists, so a snapshot of many small tracks (a task per request)
         * sets off no full collection while it is consolidated. */
        if (plain)
            PyObject_GC_UnTrack(copy);
    }
    return out;
fail:
    Py_DECREF(out);
    return NULL;
}

/* group_owned(chunks) -> {owner: [blocks]}: the blocks of TASK_BLOCKS
 * (one list, or a tuple of a ring's generations' lists, oldest first) by
 * the task they name, each task's in order (_events.owned_blocks: a dump
 * of a server's ring hands back tens of thousands of them). Anything but
 * an owned block is skipped (none is expected there). */
static PyObject *
group_owned(PyObject *module, PyObject *chunks)
{
    PyObject *one[1] = {chunks}, **items;
    Py_ssize_t n;
    if (PyTuple_CheckExact(chunks)) {
        items = &PyTuple_GET_ITEM(chunks, 0);
        n = PyTuple_GET_SIZE(chunks);
    }
    else {
        items = one;
        n = 1;
    }
    PyObject *out = PyDict_New();
    if (out == NULL)
        return NULL;
    for (Py_ssize_t c = 0; c < n; c++) {
        PyObject *lst = items[c];
        if (!PyList_CheckExact(lst)) {
            PyErr_SetString(PyExc_TypeError, "group_owned(chunks: list | tuple[list, ...])");
            goto fail;
        }
        /* nothing here runs Python code: the list is read in place */
        int64_t last_owner = -1;
        PyObject *group = NULL; /* borrowed: last_owner's */
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(lst); i++) {
            PyObject *t = PyList_GET_ITEM(lst, i);
            if (!RangeBlock_Check(t) || ((RangeBlock *)t)->owner <= 0)
                continue;
            int64_t owner = ((RangeBlock *)t)->owner;
            if (owner != last_owner) {
                PyObject *key = PyLong_FromLongLong(owner);
                if (key == NULL)
                    goto fail;
                group = PyDict_GetItemWithError(out, key);
                if (group == NULL) {
                    if (PyErr_Occurred() || (group = PyList_New(0)) == NULL) {
                        Py_DECREF(key);
                        goto fail;
                    }
                    int rc = PyDict_SetItem(out, key, group);
                    Py_DECREF(group); /* the dict holds it */
                    if (rc < 0) {
                        Py_DECREF(key);
                        goto fail;
                    }
                }
                Py_DECREF(key);
                last_owner = owner;
            }
            if (PyList_Append(group, t) < 0)
                goto fail;
        }
    }
    return out;
fail:
    Py_DECREF(out);
    return NULL;
}

static PyMethodDef block_functions[] = {
    {"group_owned", group_owned, METH_O, "group_owned(chunks) -> {owner: [blocks]}: TASK_BLOCKS by task."},
    {"raw_snapshot", raw_snapshot, METH_O, "raw_snapshot(lists) -> copies of the raw lists, blocks copied."},
    {"raw_seal", raw_seal, METH_O, "raw_seal(lst) -> bytes the raw records hold (blocks trimmed to size)."},
    {"raw_counts", raw_counts, METH_O, "raw_counts(lst) -> (ranges, instants) a raw list records."},
    {"ring_seal", ring_seal, METH_O, "ring_seal(lists) -> bytes the raw lists hold (sealed: blocks trimmed, untracked)."},
    {"ring_records", ring_records, METH_O, "ring_records(records) -> (bytes, steps, running) of sealed task records."},
    {"ring_counts", (PyCFunction)(void (*)(void))ring_counts, METH_FASTCALL,
     "ring_counts(lists, records) -> (ranges, instants, tasks, steps, running) a ring's generation holds."},
    {NULL, NULL, 0, NULL},
};

int
aprof_blocks_init(PyObject *module)
{
    if (PyType_Ready(&RangeBlockType) < 0 || PyType_Ready(&BudgetType) < 0)
        return -1;
    if (PyModule_AddObjectRef(module, "RangeBlock", (PyObject *)&RangeBlockType) < 0 ||
        PyModule_AddObjectRef(module, "Budget", (PyObject *)&BudgetType) < 0)
        return -1;
    return PyModule_AddFunctions(module, block_functions);
}
