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
    return b;
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
        cap = b->cap + 16;
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
    {"rows", (PyCFunction)RangeBlock_rows, METH_NOARGS,
     "rows() -> [(name, scope, start, args, end or None, end_thread_id, exc)]."},
    {"__sizeof__", (PyCFunction)RangeBlock_sizeof, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef RangeBlock_members[] = {
    {"scope", T_OBJECT, offsetof(RangeBlock, scope), READONLY, "The scope value of every range in the block."},
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

int
aprof_blocks_init(PyObject *module)
{
    if (PyType_Ready(&RangeBlockType) < 0)
        return -1;
    return PyModule_AddObjectRef(module, "RangeBlock", (PyObject *)&RangeBlockType);
}
