/*
 * aprof._ctracer, third part: consolidation at stop and the session's
 * columns (SPEC 6.2, 6.3, 6.5).
 *
 * When a profile stops, every range's start and end tuples become one
 * consolidated record (a 13-slot list, layout R_* in
 * aprof/_core/_recorder.py), and the records of each track are nested and
 * written into the session's EventTable (aprof/_post/_table.py): ten typed
 * columns, one value per event. aprof/_post/_events.py holds the algorithm
 * and its pure-Python twins (_records_of, _sort_by_start, _nest); this
 * file is the same steps in C, because at a million events the Python
 * loops cost about a microsecond per event.
 *
 *   EventView, ViewCache  FunctionEvent's fields (table, row), and the
 *                   per-table cache that hands out one view per row.
 *   records_of()    pair one logical thread's start and end tuples.
 *   sort_by_start() put a track's records in start order if they are not.
 *   nest()          nest one track's records into the table's columns.
 *   consolidate_raw() the three steps above in one pass over C arrays, with
 *                   no record per range (the path taken at stop unless raw
 *                   stacks need naming).
 *   children_index() each event's children, from the parent column.
 *   encode_column(), decode_column(), check_table()
 *                   the binary session format's columns, and the checks
 *                   of a table read from a file (aprof/_post/_binary.py).
 *   name_totals()   key_averages by name over the columns.
 *   chrome_plain()  the Chrome trace lines of a run of plain ranges (the
 *                   exporter's common case; aprof/_export/_chrome.py);
 *   chrome_rows()   the same, and tasks' rows (args, spawn arrow, steps).
 *   take_columns(), many_children()
 *                   EventTable.take's columns, and the rows with many
 *                   children (the summary's repeated awaits).
 *   compact_detail_rows(), compact_events(), first_starts()
 *                   the HTML report's compact document: which rows need a
 *                   detail, the flat event array as JSON text, and each
 *                   track's first start (aprof/_post/_compact.py,
 *                   Session.tracks).
 *   stitch_setup(), stitch_segments(), path_totals()
 *                   who awaits whom (aprof/_post/_stitch.py): the rows the
 *                   stitcher starts from, a track's ranges as segments by
 *                   innermost open range, and the segments' time per path.
 *   lod_keep(), lod_merge(), lod_flame()
 *                   level of detail for the HTML report past its budget
 *                   (aprof/_post/_lod.py).
 *
 * The layout constants are checked against the Python ones once, in
 * _events_setup(), so the two cannot drift apart silently.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include "_cext.h"

#ifdef __GLIBC__
#include <malloc.h>
#endif

/* The consolidated record's layout and flags (aprof/_core/_recorder.py). */
enum {
    R_NAME = 0, R_SCOPE, R_START, R_END, R_END_LT, R_EXC, R_ARGS, R_SEQ, R_FWD,
    R_INPUTS, R_STACK, R_KIND, R_EXTRA, R_SIZE
};
enum { KIND_INSTANT = 1, FLAG_UNFINISHED = 2, FLAG_ASYNC = 4, ASYNC_SAME_THREAD = -1 };

/* PyLong_AsLongLong, without its slow path: for an int of more than one
 * digit (every nanosecond time), CPython 3.11-3.13 go through
 * _PyLong_AsByteArray, some 180 instructions; the overflow variant reads
 * the digits directly. Same results, same OverflowError. */
static inline long long
ll_of(PyObject *v)
{
    int overflow = 0;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow) {
        PyErr_SetString(PyExc_OverflowError, "int too big to convert");
        return -1;
    }
    return x;
}

/* Set once by _events_setup(). */
static PyObject *scope_tuple;    /* _table.SCOPES: the scope column's RecordScopes */
static PyObject *scopes;         /* {scope value: RecordScope} */
static PyObject *start_key;      /* operator.itemgetter(R_START) */
static PyObject *str_submit_ns, *str_sort, *str_key, *minus_one, *zero;

/* ------------------------------------------------------------------------ */
/* EventView, ViewCache                                                       */
/* ------------------------------------------------------------------------ */

/* A FunctionEvent is a view of one row of its session's EventTable
 * (aprof/_post/_table.py): the table and the row's index. A table's
 * ViewCache hands out the view of a row, keeping a borrowed pointer to it
 * while anything holds it, so asking twice gives the same object; the
 * view clears its slot when it dies. Views hold the table and the cache;
 * neither holds a view, so no cycle passes through a view. */

typedef struct ViewCache ViewCache;

typedef struct {
    PyObject_HEAD
    PyObject *tab;    /* the EventTable */
    ViewCache *cache; /* the cache whose slot points here */
    Py_ssize_t i;     /* the row */
} EventView;

struct ViewCache {
    PyObject_HEAD
    PyTypeObject *cls; /* FunctionEvent */
    EventView **slots; /* borrowed; NULL where no view is alive */
    Py_ssize_t cap;
};

static void
EventView_dealloc(EventView *self)
{
    ViewCache *c = self->cache;
    if (c != NULL && self->i >= 0 && self->i < c->cap && c->slots[self->i] == self)
        c->slots[self->i] = NULL;
    Py_XDECREF(self->tab);
    Py_XDECREF((PyObject *)c);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef EventView_members[] = {
    {"_tab", T_OBJECT, offsetof(EventView, tab), READONLY, "The EventTable this event is a row of."},
    {"_i", T_PYSSIZET, offsetof(EventView, i), READONLY, "The row."},
    {NULL},
};

static PyTypeObject EventViewType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "aprof._ctracer.EventView",
    .tp_basicsize = sizeof(EventView),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "FunctionEvent's fields (_tab, _i), in C: made by a ViewCache.",
    .tp_dealloc = (destructor)EventView_dealloc,
    .tp_members = EventView_members,
};

static PyObject *
ViewCache_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *cls;
    if (kwds != NULL && PyDict_GET_SIZE(kwds)) {
        PyErr_SetString(PyExc_TypeError, "ViewCache(cls) takes no keyword arguments");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "O!:ViewCache", &PyType_Type, &cls))
        return NULL;
    PyTypeObject *tp = (PyTypeObject *)cls;
    if (!PyType_IsSubtype(tp, &EventViewType) || tp->tp_basicsize != EventViewType.tp_basicsize) {
        PyErr_Format(PyExc_TypeError, "ViewCache: %s must subclass EventView with __slots__ = ()", tp->tp_name);
        return NULL;
    }
    ViewCache *self = (ViewCache *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->cls = (PyTypeObject *)Py_NewRef(cls);
    return (PyObject *)self;
}

static void
ViewCache_dealloc(ViewCache *self)
{
    /* Every view holds the cache: none is alive here. */
    PyMem_Free(self->slots);
    Py_XDECREF(self->cls);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* get(tab, i) -> the view of row i of tab (the table that owns the cache;
 * i is not checked against its length: the caller's job). */
static PyObject *
ViewCache_get(ViewCache *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "get(tab, i)");
        return NULL;
    }
    Py_ssize_t i = PyLong_AsSsize_t(args[1]);
    if (i < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_IndexError, "event index out of range");
        return NULL;
    }
    if (i >= self->cap) {
        Py_ssize_t cap = self->cap ? self->cap * 2 : 1024;
        if (cap <= i)
            cap = i + 1;
        EventView **slots = PyMem_Realloc(self->slots, (size_t)cap * sizeof(EventView *));
        if (slots == NULL)
            return PyErr_NoMemory();
        memset(slots + self->cap, 0, (size_t)(cap - self->cap) * sizeof(EventView *));
        self->slots = slots;
        self->cap = cap;
    }
    EventView *v = self->slots[i];
    if (v != NULL)
        return Py_NewRef((PyObject *)v);
    v = (EventView *)self->cls->tp_alloc(self->cls, 0);
    if (v == NULL)
        return NULL;
    v->tab = Py_NewRef(args[0]);
    v->cache = (ViewCache *)Py_NewRef((PyObject *)self);
    v->i = i;
    self->slots[i] = v;
    return (PyObject *)v;
}

static PyMethodDef ViewCache_methods[] = {
    {"get", (PyCFunction)(void (*)(void))ViewCache_get, METH_FASTCALL, "get(tab, i): the view of row i."},
    {NULL},
};

static PyTypeObject ViewCacheType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "aprof._ctracer.ViewCache",
    .tp_basicsize = sizeof(ViewCache),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "ViewCache(cls): the FunctionEvent views of one EventTable, one per row while held.",
    .tp_new = ViewCache_new,
    .tp_dealloc = (destructor)ViewCache_dealloc,
    .tp_methods = ViewCache_methods,
};

/* ------------------------------------------------------------------------ */
/* The table's columns, borrowed as buffers                                   */
/* ------------------------------------------------------------------------ */

#define N_COLUMNS 10
static const int column_widths[N_COLUMNS] = {8, 8, 8, 8, 8, 4, 4, 4, 1, 1};
static const char *const column_attrs[N_COLUMNS] = {"start", "end",   "end_lt", "seq",   "fwd",
                                                    "name",  "track", "parent", "scope", "kind"};
enum { COL_START, COL_END, COL_END_LT, COL_SEQ, COL_FWD, COL_NAME, COL_TRACK, COL_PARENT, COL_SCOPE, COL_KIND };

typedef struct {
    Py_buffer view[N_COLUMNS];
    int got;
    Py_ssize_t n;
    int64_t *start, *end, *end_lt, *seq, *fwd;
    int32_t *name, *track, *parent;
    uint8_t *scope, *kind;
} Cols;

static void
cols_release(Cols *t)
{
    for (int c = 0; c < t->got; c++)
        PyBuffer_Release(&t->view[c]);
    t->got = 0;
}

/* One buffer of `width`-byte items; its length in items, or -1. */
static Py_ssize_t
get_column(PyObject *obj, Py_buffer *view, int width, const char *what, int writable)
{
    if (PyObject_GetBuffer(obj, view, writable ? PyBUF_WRITABLE : PyBUF_SIMPLE) < 0)
        return -1;
    if (view->itemsize != width || view->len % width) {
        PyErr_Format(PyExc_TypeError, "aprof: column %s is not an array of %d-byte values", what, width);
        PyBuffer_Release(view);
        return -1;
    }
    return view->len / width;
}

/* The ten columns of an EventTable, borrowed (cols_release gives them
 * back; the arrays cannot be resized meanwhile). */
static int
cols_get(PyObject *tab, Cols *t)
{
    t->got = 0;
    t->n = -1;
    for (int c = 0; c < N_COLUMNS; c++) {
        PyObject *col = PyObject_GetAttrString(tab, column_attrs[c]);
        if (col == NULL)
            goto fail;
        Py_ssize_t len = get_column(col, &t->view[c], column_widths[c], column_attrs[c], 0);
        Py_DECREF(col);
        if (len < 0)
            goto fail;
        t->got++;
        if (t->n < 0)
            t->n = len;
        else if (len != t->n) {
            PyErr_Format(PyExc_ValueError, "aprof: column %s has %zd values, not %zd", column_attrs[c], len, t->n);
            goto fail;
        }
    }
    t->start = t->view[COL_START].buf;
    t->end = t->view[COL_END].buf;
    t->end_lt = t->view[COL_END_LT].buf;
    t->seq = t->view[COL_SEQ].buf;
    t->fwd = t->view[COL_FWD].buf;
    t->name = t->view[COL_NAME].buf;
    t->track = t->view[COL_TRACK].buf;
    t->parent = t->view[COL_PARENT].buf;
    t->scope = t->view[COL_SCOPE].buf;
    t->kind = t->view[COL_KIND].buf;
    return 0;
fail:
    cols_release(t);
    return -1;
}

/* The sorted int32 indexes in `view` contain i? (*pos walks forward.) */
static inline int
in_sorted(const int32_t *idx, Py_ssize_t len, Py_ssize_t *pos, Py_ssize_t i)
{
    while (*pos < len && idx[*pos] < i)
        (*pos)++;
    return *pos < len && idx[*pos] == i;
}


/* ------------------------------------------------------------------------ */
/* records_of                                                                 */
/* ------------------------------------------------------------------------ */

static PyObject *
new_record(void)
{
    PyObject *rec = PyList_New(R_SIZE);
    if (rec != NULL)
        for (Py_ssize_t i = 0; i < R_SIZE; i++)
            PyList_SET_ITEM(rec, i, Py_NewRef(Py_None));
    return rec;
}

static inline void
set_slot(PyObject *rec, Py_ssize_t i, PyObject *v) /* steals v */
{
    PyObject *old = PyList_GET_ITEM(rec, i);
    PyList_SET_ITEM(rec, i, v);
    Py_DECREF(old);
}

static PyObject *
scope_of(PyObject *value)
{
    PyObject *s = PyDict_GetItemWithError(scopes, value);
    if (s == NULL && !PyErr_Occurred())
        PyErr_Format(PyExc_ValueError, "aprof: a raw record has an unknown scope %R", value);
    return s; /* borrowed */
}

/* A record holding only strings, ints and None (plus its RecordScope, a
 * module-level enum member) cannot be part of a reference cycle: take it
 * off the cyclic GC's lists, so later collections do not walk a million of
 * them. */
static void
untrack_if_atomic(PyObject *rec)
{
    for (Py_ssize_t i = 0; i < R_SIZE; i++) {
        PyObject *o = PyList_GET_ITEM(rec, i);
        if (!(i == R_SCOPE || o == Py_None || PyUnicode_CheckExact(o) || PyLong_CheckExact(o)))
            return;
    }
    PyObject_GC_UnTrack(rec);
}

/* Module-level constants a record may hold (the RecordScope members, set
 * by untrack_exempt): they live as long as the program and refer to no
 * record, so they lead no cycle back. */
#define MAX_EXEMPT 32
static PyObject *untrack_exempt_objs[MAX_EXEMPT];
static int n_untrack_exempt = 0;

struct Tracked {
    int found;
    PyObject *const *also; /* the caller's own constants, exempt too */
    int n_also;
};

static int
visit_tracked(PyObject *o, void *arg)
{
    /* an instance's heap type is visited too: a class lives as long as the
     * program's modules, and holds no instance of plain data */
    struct Tracked *st = arg;
    if (PyObject_IS_GC(o) && PyObject_GC_IsTracked(o) && !PyType_Check(o)) {
        for (int i = 0; i < n_untrack_exempt; i++)
            if (o == untrack_exempt_objs[i])
                return 0;
        for (int i = 0; i < st->n_also; i++)
            if (o == st->also[i])
                return 0;
        st->found = 1;
        return 1; /* stop: o may lead back */
    }
    return 0;
}

/* untrack_exempt(objs): the constants untrack_acyclic may find in data
 * (kept alive here for the program's life). */
static PyObject *
untrack_exempt(PyObject *Py_UNUSED(module), PyObject *objs)
{
    PyObject *seq = PySequence_Fast(objs, "untrack_exempt: a sequence of objects");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n > MAX_EXEMPT) {
        Py_DECREF(seq);
        PyErr_Format(PyExc_ValueError, "untrack_exempt: at most %d objects", MAX_EXEMPT);
        return NULL;
    }
    for (int i = 0; i < n_untrack_exempt; i++)
        Py_CLEAR(untrack_exempt_objs[i]);
    for (Py_ssize_t i = 0; i < n; i++)
        untrack_exempt_objs[i] = Py_NewRef(PySequence_Fast_GET_ITEM(seq, i));
    n_untrack_exempt = (int)n;
    Py_DECREF(seq);
    Py_RETURN_NONE;
}

/* untrack_acyclic(*objs): take each object off the cyclic GC's lists when
 * nothing it refers to is on them (only strings, ints, None, arrays, or
 * containers already taken off; an instance's class aside): it cannot be
 * part of a reference cycle,
 * so no collection needs to walk it. Given leaves first, a whole tree of
 * plain data goes. A snapshot of a flight recorder's ring builds a few
 * such containers per task; tens of thousands of them kept alive during
 * the snapshot set off full collections of the whole heap, in a program
 * that runs on (a list or dict appended to later is re-checked by
 * nothing: pass only finished data). */
void
aprof_untrack_if_acyclic(PyObject *o, PyObject *const *also, int n_also)
{
    if (o == NULL || !PyObject_IS_GC(o) || !PyObject_GC_IsTracked(o))
        return;
    traverseproc trav = Py_TYPE(o)->tp_traverse;
    struct Tracked st = {0, also, n_also};
    if (trav == NULL || trav(o, visit_tracked, &st) != 0 || st.found)
        return;
    PyObject_GC_UnTrack(o);
}

static void
untrack_if_acyclic(PyObject *o)
{
    aprof_untrack_if_acyclic(o, NULL, 0);
}

static PyObject *
untrack_acyclic(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    for (Py_ssize_t i = 0; i < nargs; i++)
        untrack_if_acyclic(args[i]);
    Py_RETURN_NONE;
}

/* records_of(raw, tid): see _events._records_of. Reads raw as it is on
 * entry; no Python code runs during the loop, so no other thread appends. */
static PyObject *
records_of(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyList_Check(args[0]) || !PyLong_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "records_of(raw: list, tid: int)");
        return NULL;
    }
    PyObject *raw = args[0], *tid = args[1];
    Py_ssize_t n = PyList_GET_SIZE(raw);
    PyObject **at = PyMem_Calloc(n > 0 ? (size_t)n : 1, sizeof(PyObject *)); /* borrowed from out */
    PyObject *out = PyList_New(0);
    if (at == NULL || out == NULL)
        goto fail;
    for (Py_ssize_t i = 0; i < n && i < PyList_GET_SIZE(raw); i++) {
        PyObject *t = PyList_GET_ITEM(raw, i);
        if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) < 4) {
            PyErr_Format(PyExc_TypeError, "aprof: raw record %zd is not a start or end tuple: %R", i, t);
            goto fail;
        }
        PyObject *t0 = PyTuple_GET_ITEM(t, 0);
        if (!PyLong_CheckExact(t0)) { /* a start names its range (str); an end, its start's index */
            PyObject *scope = scope_of(PyTuple_GET_ITEM(t, 1));
            if (scope == NULL)
                goto fail;
            PyObject *rec = new_record();
            if (rec == NULL)
                goto fail;
            set_slot(rec, R_NAME, Py_NewRef(t0));
            set_slot(rec, R_SCOPE, Py_NewRef(scope));
            set_slot(rec, R_START, Py_NewRef(PyTuple_GET_ITEM(t, 2)));
            set_slot(rec, R_ARGS, Py_NewRef(PyTuple_GET_ITEM(t, 3)));
            if (PyTuple_GET_SIZE(t) == 4 || PyTuple_GET_SIZE(t) == 5) {
                /* the fast path's user range; 5: with its raw stack (with_stack) */
                set_slot(rec, R_SEQ, Py_NewRef(minus_one));
                set_slot(rec, R_FWD, Py_NewRef(zero));
                set_slot(rec, R_KIND, Py_NewRef(zero));
                if (PyTuple_GET_SIZE(t) == 5)
                    set_slot(rec, R_STACK, Py_NewRef(PyTuple_GET_ITEM(t, 4)));
            }
            else if (PyTuple_GET_SIZE(t) == 10) {
                /* (name, scope, start, args, seq, fwd, inputs, stack, kind, extra) */
                PyObject *kind = PyTuple_GET_ITEM(t, 8);
                PyObject *extra = PyTuple_GET_ITEM(t, 9);
                long k = PyLong_AsLong(kind);
                if (k == -1 && PyErr_Occurred()) {
                    Py_DECREF(rec);
                    goto fail;
                }
                set_slot(rec, R_SEQ, Py_NewRef(PyTuple_GET_ITEM(t, 4)));
                set_slot(rec, R_FWD, Py_NewRef(PyTuple_GET_ITEM(t, 5)));
                set_slot(rec, R_INPUTS, Py_NewRef(PyTuple_GET_ITEM(t, 6)));
                set_slot(rec, R_STACK, Py_NewRef(PyTuple_GET_ITEM(t, 7)));
                set_slot(rec, R_KIND, Py_NewRef(kind));
                if (k & KIND_INSTANT)
                    set_slot(rec, R_END, Py_NewRef(PyTuple_GET_ITEM(t, 2)));
                if (PyLong_CheckExact(extra)) { /* an EXECUTOR range's submit time alone */
                    PyObject *d = PyDict_New();
                    if (d == NULL || PyDict_SetItem(d, str_submit_ns, extra) < 0) {
                        Py_XDECREF(d);
                        Py_DECREF(rec);
                        goto fail;
                    }
                    set_slot(rec, R_EXTRA, d);
                }
                else
                    set_slot(rec, R_EXTRA, Py_NewRef(extra));
            }
            else {
                Py_DECREF(rec);
                PyErr_Format(PyExc_TypeError, "aprof: raw start record %zd has %zd fields: %R", i,
                             PyTuple_GET_SIZE(t), t);
                goto fail;
            }
            untrack_if_atomic(rec);
            at[i] = rec;
            int rc = PyList_Append(out, rec);
            Py_DECREF(rec);
            if (rc < 0)
                goto fail;
        }
        else { /* (start_index, end_ns, end_thread_id, exception_name) */
            Py_ssize_t idx = PyLong_AsSsize_t(t0);
            if (idx == -1 && PyErr_Occurred())
                goto fail;
            PyObject *rec = idx >= 0 && idx < i ? at[idx] : NULL;
            if (rec == NULL || PyList_GET_ITEM(rec, R_END) != Py_None)
                continue; /* no such start, or a second end for it */
            set_slot(rec, R_END, Py_NewRef(PyTuple_GET_ITEM(t, 1)));
            PyObject *end_tid = PyTuple_GET_ITEM(t, 2);
            int same = PyObject_RichCompareBool(end_tid, tid, Py_EQ);
            if (same < 0)
                goto fail;
            if (!same) {
                long e = PyLong_AsLong(end_tid);
                if (e == -1 && PyErr_Occurred())
                    goto fail;
                set_slot(rec, R_END_LT, Py_NewRef(e == ASYNC_SAME_THREAD ? tid : end_tid));
            }
            PyObject *exc = PyTuple_GET_ITEM(t, 3);
            if (exc != Py_None) {
                set_slot(rec, R_EXC, Py_NewRef(exc));
                if (!PyUnicode_CheckExact(exc) && !PyObject_GC_IsTracked(rec))
                    PyObject_GC_Track(rec); /* only ever a str, but stay safe */
            }
        }
    }
    PyMem_Free(at);
    return out;
fail:
    PyMem_Free(at);
    Py_XDECREF(out);
    return NULL;
}

/* ------------------------------------------------------------------------ */
/* sort_by_start, nest                                                        */
/* ------------------------------------------------------------------------ */

static inline int
get_i64(PyObject *rec, Py_ssize_t slot, long long *out)
{
    *out = ll_of(PyList_GET_ITEM(rec, slot));
    return *out == -1 && PyErr_Occurred() ? -1 : 0;
}

static int
check_records(PyObject *records)
{
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(records); i++) {
        PyObject *rec = PyList_GET_ITEM(records, i);
        if (!PyList_CheckExact(rec) || PyList_GET_SIZE(rec) != R_SIZE) {
            PyErr_Format(PyExc_TypeError, "aprof: record %zd is not a consolidated record", i);
            return -1;
        }
    }
    return 0;
}

/* sort_by_start(records): sort in place by start time unless already in
 * order (an eager task's first step records before its TASK record). */
static PyObject *
sort_by_start(PyObject *module, PyObject *records)
{
    if (!PyList_Check(records)) {
        PyErr_SetString(PyExc_TypeError, "sort_by_start(records: list)");
        return NULL;
    }
    if (check_records(records) < 0)
        return NULL;
    long long prev = 0, s;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(records); i++) {
        if (get_i64(PyList_GET_ITEM(records, i), R_START, &s) < 0)
            return NULL;
        if (i > 0 && s < prev) {
            PyObject *kwnames = PyTuple_Pack(1, str_key);
            PyObject *call[2] = {records, start_key};
            PyObject *r = kwnames != NULL ? PyObject_VectorcallMethod(str_sort, call, 1, kwnames) : NULL;
            Py_XDECREF(kwnames);
            if (r == NULL)
                return NULL;
            Py_DECREF(r);
            break;
        }
        prev = s;
    }
    Py_RETURN_NONE;
}

/* Each event's children as a compressed index: the children of event i
 * are kids[off[i] .. off[i + 1]), in index (start) order. A child has its
 * parent on its own track and is not async. Both arrays are PyMem_Malloc'd
 * (off: n + 1 values); parents must be in -1..n-1. -1 on no memory. */
static int
build_children(const int32_t *parent, const int32_t *track, const uint8_t *kind, Py_ssize_t n, int32_t **off_out,
               int32_t **kids_out)
{
    int32_t *off = PyMem_Calloc((size_t)n + 1, sizeof(int32_t)), *kids = NULL, *fill = NULL;
    if (off == NULL)
        goto nomem;
#define IS_CHILD(i) (parent[i] >= 0 && !(kind[i] & FLAG_ASYNC) && track[parent[i]] == track[i])
    for (Py_ssize_t i = 0; i < n; i++)
        if (IS_CHILD(i))
            off[parent[i] + 1]++;
    for (Py_ssize_t i = 0; i < n; i++)
        off[i + 1] += off[i];
    kids = PyMem_Malloc((size_t)(off[n] > 0 ? off[n] : 1) * sizeof(int32_t));
    fill = PyMem_Malloc((size_t)(n > 0 ? n : 1) * sizeof(int32_t));
    if (kids == NULL || fill == NULL)
        goto nomem;
    memcpy(fill, off, (size_t)n * sizeof(int32_t));
    for (Py_ssize_t i = 0; i < n; i++)
        if (IS_CHILD(i))
            kids[fill[parent[i]]++] = (int32_t)i;
#undef IS_CHILD
    PyMem_Free(fill);
    *off_out = off;
    *kids_out = kids;
    return 0;
nomem:
    PyMem_Free(off);
    PyMem_Free(kids);
    PyMem_Free(fill);
    PyErr_NoMemory();
    return -1;
}

/* children_index(parent, track, kind) -> (offsets, children): see
 * EventTable.children_index (int32, native order). */
static PyObject *
children_index(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "children_index(parent, track, kind)");
        return NULL;
    }
    Py_buffer pv, tv, kv;
    Py_ssize_t n = get_column(args[0], &pv, 4, "parent", 0);
    if (n < 0)
        return NULL;
    Py_ssize_t nt = get_column(args[1], &tv, 4, "track", 0);
    if (nt < 0) {
        PyBuffer_Release(&pv);
        return NULL;
    }
    Py_ssize_t nk = get_column(args[2], &kv, 1, "kind", 0);
    PyObject *result = NULL;
    int32_t *off = NULL, *kids = NULL;
    if (nk < 0)
        goto done;
    if (nt != n || nk != n) {
        PyErr_SetString(PyExc_ValueError, "children_index: the columns differ in length");
        goto done;
    }
    const int32_t *parent = pv.buf;
    for (Py_ssize_t i = 0; i < n; i++)
        if (parent[i] < -1 || parent[i] >= n) {
            PyErr_Format(PyExc_ValueError, "children_index: event %zd has a parent index %d outside -1..%zd", i,
                         parent[i], n - 1);
            goto done;
        }
    if (build_children(parent, tv.buf, kv.buf, n, &off, &kids) < 0)
        goto done;
    result = Py_BuildValue("(y#y#)", (const char *)off, (Py_ssize_t)((n + 1) * 4), (const char *)kids,
                           (Py_ssize_t)off[n] * 4);
done:
    PyMem_Free(off);
    PyMem_Free(kids);
    PyBuffer_Release(&pv);
    PyBuffer_Release(&tv);
    if (nk >= 0)
        PyBuffer_Release(&kv);
    return result;
}

/* ------------------------------------------------------------------------ */
/* chrome_plain                                                               */
/* ------------------------------------------------------------------------ */

typedef struct {
    char *p;
    size_t len, cap;
} Buf;

static int
buf_grow(Buf *b, size_t more)
{
    if (b->len + more <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : 1 << 16;
    while (cap < b->len + more)
        cap *= 2;
    char *p = PyMem_Realloc(b->p, cap);
    if (p == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->p = p;
    b->cap = cap;
    return 0;
}

static inline void
buf_put(Buf *b, const char *s, size_t n) /* room reserved by the caller */
{
    memcpy(b->p + b->len, s, n);
    b->len += n;
}

/* Nanoseconds as microseconds with three decimals: what Python's
 * f"{ns / 1000.0:.3f}" prints, exactly, for any span under about 100 days
 * (below 2**42 us a double's error is far under half a nanosecond). */
static inline void
buf_us(Buf *b, long long ns)
{
    /* snprintf("%s%llu.%03u") by hand: two per event, it was most of the writer's time */
    char tmp[32], *end = tmp + sizeof tmp, *p = end;
    unsigned long long a = ns < 0 ? 0ull - (unsigned long long)ns : (unsigned long long)ns;
    unsigned frac = (unsigned)(a % 1000u);
    a /= 1000u;
    *--p = (char)('0' + frac % 10u);
    *--p = (char)('0' + frac / 10u % 10u);
    *--p = (char)('0' + frac / 100u);
    *--p = '.';
    do {
        *--p = (char)('0' + a % 10u);
        a /= 10u;
    } while (a);
    if (ns < 0)
        *--p = '-';
    buf_put(b, p, (size_t)(end - p));
}

/* A str's text (ASCII: what _dumps and the exporter's prefixes produce). */
static inline const char *
ascii_of(PyObject *s, Py_ssize_t *n)
{
    if (!PyUnicode_Check(s) || !PyUnicode_IS_ASCII(s)) {
        PyErr_Format(PyExc_TypeError, "aprof: chrome_plain expected ASCII text, got %R", s);
        return NULL;
    }
    *n = PyUnicode_GET_LENGTH(s);
    return (const char *)PyUnicode_DATA(s);
}

/* Time in [start, end] covered by the (start, end) pairs of the flat list
 * `flat` (sorted): _events.overlap. */
static int
steps_overlap(PyObject *flat, int64_t start, int64_t end, long long *out)
{
    Py_ssize_t n = PyList_GET_SIZE(flat), lo = 0, hi = n;
    while (lo < hi) { /* bisect_right(flat, start) */
        Py_ssize_t mid = (lo + hi) / 2;
        long long v = ll_of(PyList_GET_ITEM(flat, mid));
        if (v == -1 && PyErr_Occurred())
            return -1;
        if (start < v)
            hi = mid;
        else
            lo = mid + 1;
    }
    long long total = 0;
    for (Py_ssize_t i = lo - lo % 2; i + 1 < n; i += 2) {
        long long s0 = ll_of(PyList_GET_ITEM(flat, i)), s1 = ll_of(PyList_GET_ITEM(flat, i + 1));
        if ((s0 == -1 || s1 == -1) && PyErr_Occurred())
            return -1;
        if (s0 >= end)
            break;
        long long a = s0 > start ? s0 : start, z = s1 < end ? s1 : end;
        if (z > a)
            total += z - a;
    }
    *out = total;
    return 0;
}

/* Append a str's ASCII text, growing the buffer. */
static int
buf_text(Buf *b, PyObject *s)
{
    Py_ssize_t n = 0;
    const char *p = ascii_of(s, &n);
    if (p == NULL || buf_grow(b, (size_t)n) < 0)
        return -1;
    buf_put(b, p, (size_t)n);
    return 0;
}

/* A long long in decimal, as "%lld" prints it (room for 20 characters
 * reserved by the caller). */
static inline void
buf_ll(Buf *b, long long v)
{
    char tmp[24], *end = tmp + sizeof tmp, *p = end;
    unsigned long long a = v < 0 ? 0ull - (unsigned long long)v : (unsigned long long)v;
    do {
        *--p = (char)('0' + a % 10u);
        a /= 10u;
    } while (a);
    if (v < 0)
        *--p = '-';
    buf_put(b, p, (size_t)(end - p));
}

/* Append text with "%lld" fields (the only conversion the writer uses),
 * as snprintf would print it: vsnprintf, called some twenty times for a
 * task's rows, was most of their cost. */
static int
buf_fmt(Buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    for (const char *f = fmt; *f;) {
        const char *lit = f, *pct = strchr(f, '%'); /* libc's scan, not a loop per character */
        f = pct != NULL ? pct : f + strlen(f);
        size_t n = (size_t)(f - lit);
        if (buf_grow(b, n + 24) < 0) {
            va_end(ap);
            return -1;
        }
        buf_put(b, lit, n);
        if (*f == '%') {
            if (strncmp(f, "%lld", 4) != 0) {
                va_end(ap);
                PyErr_Format(PyExc_SystemError, "aprof: chrome_rows: format %s has a conversion other than %%lld", fmt);
                return -1;
            }
            buf_ll(b, va_arg(ap, long long));
            f += 4;
        }
    }
    va_end(ap);
    return 0;
}

/* Append microseconds (buf_us), growing the buffer. */
static int
buf_us_grow(Buf *b, long long ns)
{
    if (buf_grow(b, 32) < 0)
        return -1;
    buf_us(b, ns);
    return 0;
}

/* Append a JSON value as json.dumps (ASCII, the default separators)
 * writes it, without the call for the common ones: an exact int, an exact
 * str of printable ASCII with no quote or backslash (what
 * encode_basestring_ascii leaves as it is), a list or tuple of those;
 * anything else through dumps. */
static int exact_ll(PyObject *v, long long *out);

static int
buf_json(Buf *b, PyObject *dumps, PyObject *v, int depth)
{
    long long n = 0;
    if (exact_ll(v, &n)) {
        if (buf_grow(b, 24) < 0)
            return -1;
        buf_ll(b, n);
        return 0;
    }
    if (PyUnicode_CheckExact(v) && PyUnicode_IS_ASCII(v)) {
        Py_ssize_t len = PyUnicode_GET_LENGTH(v);
        const unsigned char *p = (const unsigned char *)PyUnicode_DATA(v);
        Py_ssize_t k = 0;
        while (k < len && p[k] >= 0x20 && p[k] < 0x7f && p[k] != '"' && p[k] != '\\')
            k++;
        if (k == len) {
            if (buf_grow(b, (size_t)len + 2) < 0)
                return -1;
            buf_put(b, "\"", 1);
            buf_put(b, (const char *)p, (size_t)len);
            buf_put(b, "\"", 1);
            return 0;
        }
    }
    else if (depth == 0 && (PyList_CheckExact(v) || PyTuple_CheckExact(v))) {
        size_t len0 = b->len;
        Py_ssize_t m = PySequence_Fast_GET_SIZE(v);
        PyObject **items = PySequence_Fast_ITEMS(v);
        if (buf_grow(b, 2) < 0)
            return -1;
        buf_put(b, "[", 1);
        for (Py_ssize_t k = 0; k < m; k++) {
            if (PySequence_Fast_GET_SIZE(v) != m) { /* changed under us (a callback): start over in Python */
                b->len = len0;
                goto call;
            }
            if (k && (buf_grow(b, 2) < 0 || (buf_put(b, ", ", 2), 0)))
                return -1;
            if (buf_json(b, dumps, items[k], depth + 1) < 0)
                return -1;
            items = PySequence_Fast_ITEMS(v);
        }
        if (buf_grow(b, 1) < 0)
            return -1;
        buf_put(b, "]", 1);
        return 0;
    }
call:;
    PyObject *d = PyObject_CallOneArg(dumps, v);
    if (d == NULL)
        return -1;
    Py_ssize_t dn = 0;
    const char *dp = ascii_of(d, &dn);
    int rc = dp == NULL || buf_grow(b, (size_t)dn) < 0 ? -1 : 0;
    if (rc == 0)
        buf_put(b, dp, (size_t)dn);
    Py_DECREF(d);
    return rc;
}

/* An exact int that fits a long long (json.dumps and an f-string print it
 * as %lld), else 0 with no error set. */
static int
exact_ll(PyObject *v, long long *out)
{
    if (v == NULL || !PyLong_CheckExact(v))
        return 0;
    int overflow = 0;
    *out = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow || (*out == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    return 1;
}

/* dumps(names[nm]), cached in jnames by name id; borrowed, NULL on error. */
static PyObject *
json_name(PyObject *jnames, PyObject *names, int32_t nm, PyObject *dumps)
{
    PyObject *key = PyLong_FromLong(nm);
    if (key == NULL)
        return NULL;
    PyObject *jname = PyDict_GetItemWithError(jnames, key); /* borrowed */
    if (jname == NULL && !PyErr_Occurred()) {
        PyObject *d = PyObject_CallOneArg(dumps, PyList_GET_ITEM(names, nm));
        int rc = d == NULL ? -1 : PyDict_SetItem(jnames, key, d);
        Py_XDECREF(d); /* the dict keeps it */
        jname = rc < 0 ? NULL : d;
    }
    Py_DECREF(key);
    return jname;
}

/* What chrome_rows needs for the tasks' rows (chrome_plain: none). */
typedef struct {
    PyObject *rare_map;    /* tab.rare: row -> [exc, args, inputs, stack, extra] */
    PyObject *pid_of;      /* per track: its pid */
    PyObject *tid_of;      /* per track: its id */
    PyObject *track_pids;  /* tid -> pid, of the session's tracks */
    PyObject *track_names; /* tid -> name, of the session's tracks */
    long long run_base;    /* the running rows' tid offset */
    long long task_scope;  /* RecordScope.TASK's index in cats */
    long long flow_id;     /* the last flow arrow's id, in and out */
} TaskCtx;

/* args keys the exporter writes before a task's extra items: an extra item
 * of the same name would take their place (dict.update), left to Python. */
static const char *const task_arg_keys[] = {"args", "exception", "unfinished", "inputs", "sequence_nr",
                                            "forward_thread_id", "end_thread_id", "stack", "running_ns",
                                            "waiting_ns", NULL};
#define N_TASK_ARG_KEYS 10
/* The same keys, and the extra's keys the writer reads, as interned str
 * (PyDict_GetItemString made a str per lookup: a dozen per task). Set by
 * aprof_events_init. */
static PyObject *task_arg_strs[N_TASK_ARG_KEYS], *str_spawn_ns, *str_steps, *str_coro, *str_outcome, *str_spawn_site,
    *str_waits;

/* extra[key] (borrowed) or NULL; NULL with an error set if the lookup failed. */
static inline PyObject *
extra_get(PyObject *extra, PyObject *key)
{
    return PyDict_GetItemWithError(extra, key);
}

/* One TASK row, as the Python loop of _chrome.chrome_trace_chunks writes
 * it: its "X" line with args, the spawn slice and flow arrow from the
 * spawner, the steps on the task's running row. 1: written; 0: a row this
 * path leaves to Python (nothing appended, no error); -1: an error. */
static int
chrome_task_row(Buf *b, TaskCtx *c, Cols *t, Py_ssize_t i, long long base, PyObject *steps, PyObject *jname,
                PyObject *names, PyObject *cat, PyObject *where, PyObject *dumps)
{
    size_t len0 = b->len;
    long long flow0 = c->flow_id;
    int32_t tr = t->track[i];
    if (t->kind[i] || t->end_lt[i] != -1 || t->seq[i] < 0 || !PyList_Check(steps) || PyList_GET_SIZE(steps) % 2 ||
        c->run_base <= 0 || tr >= PyList_GET_SIZE(c->pid_of) || tr >= PyList_GET_SIZE(c->tid_of))
        return 0;
    PyObject *key = PyLong_FromSsize_t(i);
    if (key == NULL)
        return -1;
    PyObject *x = PyDict_GetItemWithError(c->rare_map, key); /* borrowed */
    Py_DECREF(key);
    if (x == NULL)
        return PyErr_Occurred() ? -1 : 0;
    if (!PyList_CheckExact(x) || PyList_GET_SIZE(x) != 5)
        return 0;
    for (int k = 0; k < 4; k++) /* no exception, args, inputs or stack */
        if (PyList_GET_ITEM(x, k) != Py_None)
            return 0;
    PyObject *extra = PyList_GET_ITEM(x, 4);
    if (!PyDict_CheckExact(extra) || PyDict_GET_SIZE(extra) == 0)
        return 0;
    long long pid = 0, tid = 0, fwd = t->fwd[i], seq = t->seq[i], start = t->start[i], end = t->end[i];
    if (!exact_ll(PyList_GET_ITEM(c->pid_of, tr), &pid) || !exact_ll(PyList_GET_ITEM(c->tid_of, tr), &tid))
        return 0;
    for (int k = 0; k < N_TASK_ARG_KEYS; k++)
        if (extra_get(extra, task_arg_strs[k]) != NULL)
            return 0;
        else if (PyErr_Occurred())
            return -1;
    long long running = 0;
    if (steps_overlap(steps, start, end, &running) < 0)
        return -1;
    long long waiting = end - start - running;
    /* the "X" line */
    if (b->len && buf_fmt(b, ",\n") < 0)
        goto fail;
    if (buf_fmt(b, "{\"ph\":\"X\",\"name\":") < 0 || buf_text(b, jname) < 0 || buf_fmt(b, ",\"cat\":\"") < 0 ||
        buf_text(b, cat) < 0 || buf_fmt(b, "\",") < 0 || buf_text(b, where) < 0 || buf_fmt(b, ",\"ts\":") < 0 ||
        buf_us_grow(b, start - base) < 0 || buf_fmt(b, ",\"dur\":") < 0 || buf_us_grow(b, end - start) < 0 ||
        buf_fmt(b, ",\"args\":{\"sequence_nr\": %lld", seq) < 0)
        goto fail;
    if (fwd && buf_fmt(b, ", \"forward_thread_id\": %lld", fwd) < 0)
        goto fail;
    if (buf_fmt(b, ", \"running_ns\": %lld, \"waiting_ns\": %lld", running, waiting > 0 ? waiting : 0) < 0)
        goto fail;
    Py_ssize_t pos = 0;
    PyObject *k, *v;
    while (PyDict_Next(extra, &pos, &k, &v)) {
        if (!PyUnicode_CheckExact(k))
            goto not_here;
        if (PyUnicode_CompareWithASCIIString(k, "steps") == 0)
            continue;
        if (buf_fmt(b, ", ") < 0 || buf_json(b, dumps, k, 0) < 0 || buf_fmt(b, ": ") < 0 ||
            buf_json(b, dumps, v, 0) < 0)
            goto fail;
    }
    if (buf_fmt(b, "}}") < 0)
        goto fail;
    /* the spawn slice and the flow arrow */
    if (fwd && seq > 0) {
        long long link_ns = start;
        PyObject *at = extra_get(extra, str_spawn_ns);
        if (at == NULL && !PyErr_Occurred())
            at = extra_get(extra, str_submit_ns);
        if (at == NULL && PyErr_Occurred())
            goto fail;
        if (at != NULL && !exact_ll(at, &link_ns))
            goto not_here;
        PyObject *fkey = PyLong_FromLongLong(fwd), *tkey = PyLong_FromLongLong(tid);
        PyObject *fp = NULL, *tn = NULL;
        if (fkey != NULL && tkey != NULL) {
            fp = PyDict_GetItemWithError(c->track_pids, fkey);
            if (fp == NULL && !PyErr_Occurred())
                fp = PyList_GET_ITEM(c->pid_of, tr);
            tn = fp == NULL ? NULL : PyDict_GetItemWithError(c->track_names, tkey);
            if (fp != NULL && tn == NULL && !PyErr_Occurred())
                tn = PyList_GET_ITEM(names, t->name[i]);
        }
        Py_XDECREF(fkey);
        Py_XDECREF(tkey);
        if (fp == NULL || tn == NULL) {
            if (PyErr_Occurred())
                goto fail;
            goto not_here;
        }
        long long fpid = 0;
        if (!exact_ll(fp, &fpid) || !PyUnicode_CheckExact(tn))
            goto not_here;
        PyObject *label = PyUnicode_FromFormat("spawn %U", tn);
        if (label == NULL)
            goto fail;
        int rc = buf_fmt(b, ",\n{\"ph\":\"X\",\"name\":") < 0 || buf_json(b, dumps, label, 0) < 0;
        Py_DECREF(label);
        long long id = ++c->flow_id;
        if (rc || buf_fmt(b, ",\"cat\":\"spawn\",\"pid\":%lld,\"tid\":%lld,\"ts\":", fpid, fwd) < 0 ||
            buf_us_grow(b, link_ns - base) < 0 || buf_fmt(b, ",\"dur\":0.000}") < 0 ||
            buf_fmt(b, ",\n{\"ph\":\"s\",\"name\":\"spawn\",\"cat\":\"") < 0 || buf_text(b, cat) < 0 ||
            buf_fmt(b, "\",\"id\":%lld,\"pid\":%lld,\"tid\":%lld,\"ts\":", id, fpid, fwd) < 0 ||
            buf_us_grow(b, link_ns - base) < 0 ||
            buf_fmt(b, "},\n{\"ph\":\"f\",\"bp\":\"e\",\"name\":\"spawn\",\"cat\":\"") < 0 || buf_text(b, cat) < 0 ||
            buf_fmt(b, "\",\"id\":%lld,", id) < 0 || buf_text(b, where) < 0 || buf_fmt(b, ",\"ts\":") < 0 ||
            buf_us_grow(b, start - base) < 0 || buf_fmt(b, "}") < 0)
            goto fail;
    }
    /* the steps, on the task's running row */
    PyObject *ts = extra_get(extra, str_steps);
    if (ts == NULL && PyErr_Occurred())
        goto fail;
    if (ts != NULL && ts != Py_None) {
        if (!PyList_CheckExact(ts) && !PyTuple_CheckExact(ts))
            goto not_here;
        Py_ssize_t ns = PySequence_Fast_GET_SIZE(ts);
        PyObject **items = PySequence_Fast_ITEMS(ts);
        for (Py_ssize_t s = 0; s + 1 < ns; s += 2) {
            long long s0 = 0, s1 = 0;
            if (!exact_ll(items[s], &s0) || !exact_ll(items[s + 1], &s1))
                goto not_here;
            if (buf_fmt(b, ",\n{\"ph\":\"X\",\"name\":\"running\",\"cat\":\"step\",\"pid\":%lld,\"tid\":%lld,\"ts\":",
                        pid, c->run_base + tid) < 0 ||
                buf_us_grow(b, s0 - base) < 0 || buf_fmt(b, ",\"dur\":") < 0 || buf_us_grow(b, s1 - s0) < 0 ||
                buf_fmt(b, "}") < 0)
                goto fail;
        }
    }
    return 1;
not_here:
    b->len = len0;
    c->flow_id = flow0;
    return 0;
fail:
    b->len = len0;
    c->flow_id = flow0;
    return -1;
}

/* chrome_plain(tab, i, base, wheres, json_names, cats, dumps, limit, rare, steps)
 *     -> (text, next_i)
 * chrome_rows(tab, i, base, wheres, json_names, cats, dumps, limit, rare, steps,
 *             rare_map, pid_of, tid_of, track_pids, track_names, run_base,
 *             task_scope, flow_id) -> (text, next_i, flow_id)
 *
 * The lines, joined by ",\n", of rows i, i+1, ... of the EventTable `tab`
 * while they are plain ranges (kind 0, no sequence number, spawner or other
 * ending thread, not in `rare`: the exporter's test) or, for chrome_rows,
 * tasks (chrome_task_row), at most `limit` rows; next_i is the first row
 * not written. wheres[track] is its '"pid":P,"tid":T'; steps[track] None,
 * or a task track's flat step list (its ranges then get running and
 * waiting time); json_names caches dumps(name) by name id; cats[scope] is
 * the category; rare the sorted int32 indexes of the rows with rare fields.
 * chrome_rows' flow_id is the last flow arrow's id: the next one is +1. */
static PyObject *
chrome_impl(PyObject *const *args, Py_ssize_t nargs, TaskCtx *ctx)
{
    if (nargs < 10 || !PyList_Check(args[3]) || !PyDict_Check(args[4]) || !PyTuple_Check(args[5]) ||
        !PyCallable_Check(args[6]) || !PyList_Check(args[9]) || PyList_GET_SIZE(args[9]) != PyList_GET_SIZE(args[3])) {
        PyErr_SetString(PyExc_TypeError,
                        "chrome_plain(tab, i, base, wheres, json_names, cats, dumps, limit, rare, steps)");
        return NULL;
    }
    PyObject *steps_of = args[9]; /* per track: None, or a task's flat (start, end) step list */
    PyObject *tab = args[0], *wheres = args[3], *jnames = args[4], *cats = args[5], *dumps = args[6];
    Py_ssize_t i = PyLong_AsSsize_t(args[1]);
    long long base = ll_of(args[2]);
    Py_ssize_t limit = PyLong_AsSsize_t(args[7]);
    if (PyErr_Occurred())
        return NULL;
    Cols t;
    if (cols_get(tab, &t) < 0)
        return NULL;
    Py_buffer rv;
    Py_ssize_t n_rare = get_column(args[8], &rv, 4, "rare", 0);
    PyObject *names = PyObject_GetAttrString(tab, "names"), *result = NULL, **jcache = NULL;
    Buf b = {NULL, 0, 0};
    if (n_rare < 0 || names == NULL || !PyList_Check(names))
        goto done;
    /* Room for `limit` rows at a typical line's length (some 230 bytes), so
     * a batch is not copied by doubling reallocs on its way to its size. */
    if (limit > 0 && buf_grow(&b, (size_t)(limit < 32768 ? limit : 32768) * 256) < 0)
        goto done;
    const int32_t *rare = rv.buf;
    /* the first rare index >= i */
    Py_ssize_t lo = 0, hi = n_rare;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        if (rare[mid] < i)
            lo = mid + 1;
        else
            hi = mid;
    }
    Py_ssize_t rpos = lo, written = 0, ncats = PyTuple_GET_SIZE(cats), nwheres = PyList_GET_SIZE(wheres),
               n_names = PyList_GET_SIZE(names);
    /* json_names' entries by name id for this call (borrowed: the dict holds them) */
    jcache = PyMem_Calloc((size_t)n_names + 1, sizeof(PyObject *));
    if (jcache == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (i = i < 0 ? 0 : i; i < t.n && written < limit; i++) {
        int32_t tr = t.track[i], nm = t.name[i];
        if (tr < 0 || tr >= nwheres || t.scope[i] >= ncats || nm < 0 || nm >= n_names)
            break;
        PyObject *where = PyList_GET_ITEM(wheres, tr), *cat = PyTuple_GET_ITEM(cats, t.scope[i]);
        PyObject *steps = PyList_GET_ITEM(steps_of, tr);
        if (in_sorted(rare, n_rare, &rpos, i) || t.kind[i] || t.seq[i] >= 0 || t.fwd[i] || t.end_lt[i] != -1) {
            if (ctx == NULL || t.scope[i] != ctx->task_scope)
                break;
            PyObject *jname = jcache[nm] ? jcache[nm] : (jcache[nm] = json_name(jnames, names, nm, dumps));
            if (jname == NULL)
                goto done;
            int rc = chrome_task_row(&b, ctx, &t, i, base, steps, jname, names, cat, where, dumps);
            if (rc < 0)
                goto done;
            if (rc == 0)
                break;
            written++;
            continue;
        }
        long long running = 0;
        if (steps != Py_None) { /* a task's track: the range's running time (_events.overlap) */
            if (!PyList_Check(steps) || PyList_GET_SIZE(steps) % 2 != 0)
                break;
            if (steps_overlap(steps, t.start[i], t.end[i], &running) < 0)
                goto done;
        }
        PyObject *jname = jcache[nm] ? jcache[nm] : (jcache[nm] = json_name(jnames, names, nm, dumps));
        if (jname == NULL)
            goto done;
        Py_ssize_t nw = 0, nn = 0, nc = 0;
        const char *w = ascii_of(where, &nw), *jn = ascii_of(jname, &nn), *ct = ascii_of(cat, &nc);
        if (w == NULL || jn == NULL || ct == NULL)
            goto done;
        if (buf_grow(&b, (size_t)(nw + nn + nc) + 128) < 0)
            goto done;
        if (b.len)
            buf_put(&b, ",\n", 2);
        buf_put(&b, "{\"ph\":\"X\",\"name\":", 17);
        buf_put(&b, jn, (size_t)nn);
        buf_put(&b, ",\"cat\":\"", 8);
        buf_put(&b, ct, (size_t)nc);
        buf_put(&b, "\",", 2);
        buf_put(&b, w, (size_t)nw);
        buf_put(&b, ",\"ts\":", 6);
        buf_us(&b, t.start[i] - base);
        buf_put(&b, ",\"dur\":", 7);
        buf_us(&b, t.end[i] - t.start[i]);
        if (steps != Py_None) { /* json.dumps' spelling, as _chrome's Python path */
            long long waiting = t.end[i] - t.start[i] - running;
            if (buf_grow(&b, 96) < 0)
                goto done;
            static const char k_running[] = ",\"args\":{\"running_ns\": ", k_waiting[] = ", \"waiting_ns\": ";
            buf_put(&b, k_running, sizeof k_running - 1);
            buf_ll(&b, running);
            buf_put(&b, k_waiting, sizeof k_waiting - 1);
            buf_ll(&b, waiting > 0 ? waiting : 0);
            buf_put(&b, "}", 1);
        }
        buf_put(&b, "}", 1);
        written++;
    }
    /* The buffer is ASCII by construction (ascii_of, buf_json, literals and
     * digits): copied into a new str as it is, with no decoder's pass. */
    PyObject *text = PyUnicode_New((Py_ssize_t)b.len, 127);
    if (text != NULL && b.len)
        memcpy(PyUnicode_DATA(text), b.p, b.len);
    if (text != NULL)
        result = ctx == NULL ? Py_BuildValue("(Nn)", text, i) : Py_BuildValue("(NnL)", text, i, ctx->flow_id);
done:
    PyMem_Free(jcache);
    PyMem_Free(b.p);
    Py_XDECREF(names);
    if (n_rare >= 0)
        PyBuffer_Release(&rv);
    cols_release(&t);
    return result;
}

static PyObject *
chrome_plain(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 10) {
        PyErr_SetString(PyExc_TypeError,
                        "chrome_plain(tab, i, base, wheres, json_names, cats, dumps, limit, rare, steps)");
        return NULL;
    }
    return chrome_impl(args, nargs, NULL);
}

static PyObject *
chrome_rows(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 18 || !PyDict_Check(args[10]) || !PyList_Check(args[11]) || !PyList_Check(args[12]) ||
        !PyDict_Check(args[13]) || !PyDict_Check(args[14])) {
        PyErr_SetString(PyExc_TypeError,
                        "chrome_rows(tab, i, base, wheres, json_names, cats, dumps, limit, rare, steps, rare_map, "
                        "pid_of, tid_of, track_pids, track_names, run_base, task_scope, flow_id)");
        return NULL;
    }
    TaskCtx ctx = {args[10], args[11], args[12], args[13], args[14], 0, 0, 0};
    ctx.run_base = ll_of(args[15]);
    ctx.task_scope = ll_of(args[16]);
    ctx.flow_id = ll_of(args[17]);
    if (PyErr_Occurred())
        return NULL;
    return chrome_impl(args, nargs, &ctx);
}

/* The body of s's JSON string (what dumps(s) writes inside its quotes),
 * appended: s itself when it is printable ASCII with no quote or
 * backslash, else dumps(s) without its quotes. JSON's escapes go code point
 * by code point, so the JSON of a concatenation is its parts' bodies in
 * one pair of quotes. */
static int
buf_json_body(Buf *b, PyObject *dumps, PyObject *s)
{
    size_t j0 = b->len;
    if (buf_json(b, dumps, s, 1) < 0)
        return -1;
    size_t n = b->len - j0;
    if (n < 2 || b->p[j0] != '"' || b->p[b->len - 1] != '"') {
        b->len = j0;
        PyErr_SetString(PyExc_ValueError, "aprof: chrome_tracks: a label's JSON is not a string");
        return -1;
    }
    memmove(b->p + j0, b->p + j0 + 1, n - 2);
    b->len = j0 + n - 2;
    return 0;
}

/* task_coroutines' row i, a TASK row whose extra is `extra`: its track's
 * coroutine into `out`. 0 done (or nothing to add), -1 an error, 1 not
 * plain (the Python loop reads them all). */
static int
task_coroutine(PyObject *out, PyObject *extra, PyObject *tracks, Cols *t, Py_ssize_t i, PyObject *s_id,
               PyObject *s_coro)
{
    int truth = PyObject_IsTrue(extra);
    if (truth <= 0)
        return truth;
    if (!PyDict_Check(extra))
        return 1;
    int32_t tr = t->track[i], p = t->parent[i];
    if (tr < 0 || tr >= PyList_GET_SIZE(tracks) || p >= t->n ||
        (p >= 0 && (t->track[p] < 0 || t->track[p] >= PyList_GET_SIZE(tracks))))
        return 1;
    PyObject *tid = PyObject_GetAttr(PyList_GET_ITEM(tracks, tr), s_id);
    if (tid == NULL)
        return -1;
    if (p >= 0) {
        PyObject *ptid = PyObject_GetAttr(PyList_GET_ITEM(tracks, t->track[p]), s_id);
        int same = ptid == NULL ? -1 : PyObject_RichCompareBool(ptid, tid, Py_EQ);
        Py_XDECREF(ptid);
        if (same != 0) {
            Py_DECREF(tid);
            return same < 0 ? -1 : 0;
        }
    }
    PyObject *coro = PyDict_GetItemWithError(extra, s_coro); /* extra.get("coro") */
    Py_XINCREF(coro);
    int ok = coro != NULL || !PyErr_Occurred();
    int has = ok && coro != NULL ? PyObject_IsTrue(coro) : 0;
    if (has > 0) {
        PyObject *str = PyObject_Str(coro);
        ok = str != NULL && PyDict_SetItem(out, tid, str) == 0;
        Py_XDECREF(str);
    }
    Py_XDECREF(coro);
    Py_DECREF(tid);
    return !ok || has < 0 ? -1 : 0;
}

/* task_coroutines(tab, task_scope) -> dict | None
 *
 * _chrome._task_coroutines over the table's columns: each task track's
 * coroutine (str(extra["coro"]) of its TASK row, one not nested on its own
 * track), by track id. None when a TASK row's extra is not a dict (a
 * damaged file's): the Python loop then reads them all. */
static PyObject *
task_coroutines(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "task_coroutines(tab, task_scope: int)");
        return NULL;
    }
    long task_scope = PyLong_AsLong(args[1]);
    if (task_scope == -1 && PyErr_Occurred())
        return NULL;
    Cols t;
    if (cols_get(args[0], &t) < 0)
        return NULL;
    static PyObject *s_id, *s_coro;
    PyObject *rare = PyObject_GetAttrString(args[0], "rare"), *tracks = PyObject_GetAttrString(args[0], "tracks");
    PyObject *out = PyDict_New(), *result = NULL;
    if (rare == NULL || tracks == NULL || out == NULL)
        goto done;
    if (!PyDict_Check(rare) || !PyList_Check(tracks)) {
        PyErr_SetString(PyExc_TypeError, "task_coroutines: tab is not an EventTable");
        goto done;
    }
    if (s_coro == NULL &&
        ((s_id = PyUnicode_InternFromString("id")) == NULL || (s_coro = PyUnicode_InternFromString("coro")) == NULL))
        goto done;
    for (Py_ssize_t i = 0; i < t.n; i++) {
        if (t.scope[i] != task_scope)
            continue;
        PyObject *key = PyLong_FromSsize_t(i);
        if (key == NULL)
            goto done;
        PyObject *x = PyDict_GetItemWithError(rare, key); /* borrowed */
        Py_DECREF(key);
        if (x == NULL) {
            if (PyErr_Occurred())
                goto done;
            continue;
        }
        if (!PyList_Check(x) || PyList_GET_SIZE(x) != 5)
            goto python;
        /* strong: its truth test, the lookups and str() can run Python */
        PyObject *extra = Py_NewRef(PyList_GET_ITEM(x, 4));
        int step = task_coroutine(out, extra, tracks, &t, i, s_id, s_coro);
        Py_DECREF(extra);
        if (step < 0)
            goto done;
        if (step > 0)
            goto python;
    }
    result = Py_NewRef(out);
    goto done;
python:
    result = Py_NewRef(Py_None);
done:
    Py_XDECREF(rare);
    Py_XDECREF(tracks);
    Py_XDECREF(out);
    cols_release(&t);
    return result;
}

/* chrome_tracks(tracks, pids, coros, run_base, dumps) -> str | None
 *
 * The metadata lines of every track (_chrome.chrome_trace_chunks' track
 * loop), joined by ",\n": its thread_name (track_label's label: the task's
 * coroutine, its kind) and thread_sort_index (2 * its place), and for a
 * task with steps the same for its running row (tid run_base + its id,
 * sort index 2 * its place + 1). None, having written nothing, when a
 * track's fields are not plain (its id, node or pid not an int, its name,
 * kind or coroutine not a str): the Python loop then writes them all. A
 * task per request makes tens of thousands of tracks: their f-strings were
 * a tenth of the export. */
static PyObject *
chrome_tracks(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5 || !PyList_Check(args[0]) || !PyDict_Check(args[1]) || !PyDict_Check(args[2]) ||
        !PyCallable_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError, "chrome_tracks(tracks: list, pids: dict, coros: dict, run_base: int, dumps)");
        return NULL;
    }
    PyObject *tracks = args[0], *pids = args[1], *coros = args[2], *dumps = args[4];
    long long run_base = ll_of(args[3]);
    if (run_base == -1 && PyErr_Occurred())
        return NULL;
    static PyObject *s_id, *s_node_id, *s_name, *s_kind, *s_steps, *s_thread;
    if (s_thread == NULL && ((s_id = PyUnicode_InternFromString("id")) == NULL ||
                             (s_node_id = PyUnicode_InternFromString("node_id")) == NULL ||
                             (s_name = PyUnicode_InternFromString("name")) == NULL ||
                             (s_kind = PyUnicode_InternFromString("kind")) == NULL ||
                             (s_steps = PyUnicode_InternFromString("steps")) == NULL ||
                             (s_thread = PyUnicode_InternFromString("thread")) == NULL))
        return NULL;
    static const char thread_name[] = "{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":%lld,\"tid\":%lld,\"args\":{\"name\":",
                      sort_index[] = "}},\n{\"ph\":\"M\",\"name\":\"thread_sort_index\",\"pid\":%lld,\"tid\":%lld,"
                                     "\"args\":{\"sort_index\":%lld}}";
    Buf b = {NULL, 0, 0};
    PyObject *result = NULL;
    for (Py_ssize_t k = 0; k < PyList_GET_SIZE(tracks); k++) {
        PyObject *t = PyList_GET_ITEM(tracks, k);
        Py_INCREF(t);
        PyObject *tid_o = PyObject_GetAttr(t, s_id), *node = PyObject_GetAttr(t, s_node_id),
                 *name = PyObject_GetAttr(t, s_name), *kind = PyObject_GetAttr(t, s_kind),
                 *steps = PyObject_GetAttr(t, s_steps);
        /* strong: the label's _dumps calls run Python, which could change the dicts */
        PyObject *pid_o = NULL, *coro = NULL;
        int rc = -1; /* -1: an error; 1: not plain, for the Python loop */
        if (tid_o == NULL || node == NULL || name == NULL || kind == NULL || steps == NULL)
            goto next;
        pid_o = PyDict_GetItemWithError(pids, node); /* pids.get(node, node) */
        if (pid_o == NULL && PyErr_Occurred())
            goto next;
        pid_o = Py_NewRef(pid_o == NULL ? node : pid_o);
        coro = PyDict_GetItemWithError(coros, tid_o); /* coros.get(tid) */
        if (coro == NULL && PyErr_Occurred())
            goto next;
        Py_XINCREF(coro);
        long long tid = 0, pid = 0;
        int has_steps = steps == Py_None ? 0 : PyObject_IsTrue(steps);
        if (has_steps < 0)
            goto next;
        if (!exact_ll(tid_o, &tid) || !exact_ll(pid_o, &pid) || !PyUnicode_CheckExact(name) ||
            !PyUnicode_CheckExact(kind) || (coro != NULL && !PyUnicode_CheckExact(coro))) {
            rc = 1;
            goto next;
        }
        /* track_label(track, coro): "name (task coro) [kind]", its coroutine
         * unless the name has it, its kind unless a thread */
        int with_coro = 0, with_kind = PyUnicode_Compare(kind, s_thread) != 0;
        if (with_kind && PyErr_Occurred())
            goto next;
        if (coro != NULL && PyUnicode_GET_LENGTH(coro) > 0) {
            int in = PyUnicode_Contains(name, coro);
            if (in < 0)
                goto next;
            with_coro = !in;
        }
        if ((b.len && buf_fmt(&b, ",\n") < 0) || buf_fmt(&b, thread_name, pid, tid) < 0)
            goto next;
        size_t j0 = b.len; /* the label's JSON (_dumps), in pieces */
        if (buf_fmt(&b, "\"") < 0 || buf_json_body(&b, dumps, name) < 0 ||
            (with_coro && (buf_fmt(&b, " (task ") < 0 || buf_json_body(&b, dumps, coro) < 0 || buf_fmt(&b, ")") < 0)) ||
            (with_kind && (buf_fmt(&b, " [") < 0 || buf_json_body(&b, dumps, kind) < 0 || buf_fmt(&b, "]") < 0)) ||
            buf_fmt(&b, "\"") < 0)
            goto next;
        size_t jn = b.len - j0;
        if (buf_fmt(&b, sort_index, pid, tid, 2 * (long long)k) < 0)
            goto next;
        if (has_steps) { /* the running row: _dumps(label + " running"), the label's JSON with " running" in it */
            long long rid = run_base + tid;
            if (buf_fmt(&b, ",\n") < 0 || buf_fmt(&b, thread_name, pid, rid) < 0 || buf_grow(&b, jn + 16) < 0)
                goto next;
            memcpy(b.p + b.len, b.p + j0, jn - 1); /* earlier in the buffer: no overlap */
            b.len += jn - 1;
            buf_put(&b, " running\"", 9);
            if (buf_fmt(&b, sort_index, pid, rid, 2 * (long long)k + 1) < 0)
                goto next;
        }
        rc = 0;
    next:
        Py_XDECREF(pid_o);
        Py_XDECREF(coro);
        Py_XDECREF(tid_o);
        Py_XDECREF(node);
        Py_XDECREF(name);
        Py_XDECREF(kind);
        Py_XDECREF(steps);
        Py_DECREF(t);
        if (rc < 0)
            goto done;
        if (rc > 0) {
            result = Py_NewRef(Py_None);
            goto done;
        }
    }
    result = PyUnicode_New((Py_ssize_t)b.len, 127);
    if (result != NULL && b.len)
        memcpy(PyUnicode_DATA(result), b.p, b.len);
done:
    PyMem_Free(b.p);
    return result;
}

/* ------------------------------------------------------------------------ */
/* Session columns: the binary format's writer and reader                    */
/* ------------------------------------------------------------------------ */

/* aprof/_post/_binary.py has the format and the pure-Python twins
 * (_encode, _decode, and _validate._check_table for check_table). */

/* A column as the file stores it (_binary.py, "Columns"): each value
 * less the one before it (COL_START) or less its start (COL_END), modulo
 * 2**64, then byte-shuffled: byte 0 (the least significant) of every
 * value, then byte 1, and so on, so the high bytes, nearly all equal,
 * make long runs that zlib packs small and fast. */
static void
encode_into(const void *vals, const int64_t *starts, Py_ssize_t n, int c, uint8_t *o)
{
    int width = column_widths[c];
    if (width == 1) {
        memcpy(o, vals, (size_t)n);
        return;
    }
    uint64_t prev = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t v = width == 8 ? (uint64_t)((const int64_t *)vals)[i] : (uint64_t)(uint32_t)((const int32_t *)vals)[i];
        uint64_t x = v;
        if (c == COL_START) {
            x = v - prev;
            prev = v;
        }
        else if (c == COL_END)
            x = v - (uint64_t)starts[i];
        for (int k = 0; k < width; k++)
            o[(Py_ssize_t)k * n + i] = (uint8_t)(x >> (8 * k));
    }
}

/* encode_into undone, into vals (n values of the column's width). */
static void
decode_into(const uint8_t *in, void *vals, const int64_t *starts, Py_ssize_t n, int c)
{
    int width = column_widths[c];
    if (width == 1) {
        memcpy(vals, in, (size_t)n);
        return;
    }
    uint64_t prev = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t x = 0;
        for (int k = 0; k < width; k++)
            x |= (uint64_t)in[(Py_ssize_t)k * n + i] << (8 * k);
        if (c == COL_START)
            x = prev = prev + x;
        else if (c == COL_END)
            x += (uint64_t)starts[i];
        if (width == 8)
            ((int64_t *)vals)[i] = (int64_t)x;
        else
            ((int32_t *)vals)[i] = (int32_t)(uint32_t)x;
    }
}

static int
column_index(PyObject *o)
{
    long c = PyLong_AsLong(o);
    if (c == -1 && PyErr_Occurred())
        return -1;
    if (c < 0 || c >= N_COLUMNS) {
        PyErr_Format(PyExc_ValueError, "no column %ld", c);
        return -1;
    }
    return (int)c;
}

/* encode_column(col, c, starts) -> bytes: column c (an array) as the file
 * stores it; starts is the start column (read for c == 1, end_ns). */
static PyObject *
encode_column(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "encode_column(col, c, starts)");
        return NULL;
    }
    int c = column_index(args[1]);
    if (c < 0)
        return NULL;
    Py_buffer v, s = {0};
    Py_ssize_t n = get_column(args[0], &v, column_widths[c], column_attrs[c], 0);
    if (n < 0)
        return NULL;
    PyObject *out = NULL;
    if (c == COL_END) {
        Py_ssize_t ns = get_column(args[2], &s, 8, "start", 0);
        if (ns < 0)
            goto done;
        if (ns != n) {
            PyErr_SetString(PyExc_ValueError, "encode_column: start and end differ in length");
            goto done;
        }
    }
    out = PyBytes_FromStringAndSize(NULL, n * column_widths[c]);
    if (out != NULL)
        encode_into(v.buf, s.buf, n, c, (uint8_t *)PyBytes_AS_STRING(out));
done:
    PyBuffer_Release(&v);
    if (s.obj != NULL)
        PyBuffer_Release(&s);
    return out;
}

/* decode_column(data, c, out, starts): decode a block into `out`, a
 * writable array of the column's type whose length is the event count;
 * data must be exactly that many values; starts (the decoded start
 * column) is read for c == 1, end_ns. */
static PyObject *
decode_column(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "decode_column(data, c, out, starts)");
        return NULL;
    }
    int c = column_index(args[1]);
    if (c < 0)
        return NULL;
    Py_buffer d, o, s = {0};
    if (PyObject_GetBuffer(args[0], &d, PyBUF_SIMPLE) < 0)
        return NULL;
    Py_ssize_t n = get_column(args[2], &o, column_widths[c], column_attrs[c], 1);
    PyObject *result = NULL;
    if (n < 0) {
        PyBuffer_Release(&d);
        return NULL;
    }
    if (d.len != n * column_widths[c]) {
        PyErr_Format(PyExc_ValueError, "block %s has %zd bytes, not %zd", column_attrs[c], d.len,
                     n * column_widths[c]);
        goto done;
    }
    if (c == COL_END) {
        Py_ssize_t ns = get_column(args[3], &s, 8, "start", 0);
        if (ns < 0)
            goto done;
        if (ns != n) {
            PyErr_SetString(PyExc_ValueError, "decode_column: decode the start column first");
            goto done;
        }
    }
    decode_into(d.buf, o.buf, s.buf, n, c);
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&d);
    PyBuffer_Release(&o);
    if (s.obj != NULL)
        PyBuffer_Release(&s);
    return result;
}

/* "event i ('name...')": for messages. */
static PyObject *
event_label(Py_ssize_t i, PyObject *name)
{
    PyObject *cut = PyUnicode_Substring(name, 0, 80);
    if (cut == NULL)
        return NULL;
    PyObject *label = PyUnicode_FromFormat("event %zd (%R)", i, cut);
    Py_DECREF(cut);
    return label;
}

static void
event_error(Py_ssize_t i, PyObject *name, const char *what)
{
    PyObject *label = event_label(i, name);
    if (label != NULL)
        PyErr_Format(PyExc_ValueError, "%U %s", label, what);
    Py_XDECREF(label);
}

/* check_table(tab, profile_start, max_thread_id): validate_session's checks
 * of an EventTable's columns, with _validate._check_table's messages:
 * indexes in range, times, flags, thread ids, track grouping and order,
 * nesting, cycles. ValueError naming the event. */
static PyObject *
check_table(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "check_table(tab, profile_start, max_thread_id)");
        return NULL;
    }
    long long profile_start = ll_of(args[1]), max_tid = ll_of(args[2]);
    if ((profile_start == -1 || max_tid == -1) && PyErr_Occurred())
        return NULL;
    Cols t;
    if (cols_get(args[0], &t) < 0)
        return NULL;
    PyObject *names = PyObject_GetAttrString(args[0], "names"), *tracks = PyObject_GetAttrString(args[0], "tracks");
    uint8_t *state = NULL;
    int32_t *chain = NULL, *off = NULL, *kids = NULL;
    PyObject *result = NULL;
    if (names == NULL || tracks == NULL)
        goto done;
    if (!PyList_Check(names) || !PyList_Check(tracks)) {
        PyErr_SetString(PyExc_TypeError, "check_table: tab is not an EventTable");
        goto done;
    }
    Py_ssize_t n = t.n, n_names = PyList_GET_SIZE(names), n_tracks = PyList_GET_SIZE(tracks),
               n_scopes = PyTuple_GET_SIZE(scope_tuple);
    state = PyMem_Calloc((size_t)(n_tracks > n ? n_tracks : n) + 1, 1);
    chain = PyMem_Malloc(((size_t)n + 1) * sizeof(int32_t));
    if (state == NULL || chain == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    /* Indexes first: the checks below read names and parents through them. */
    static const int index_cols[] = {COL_NAME, COL_TRACK, COL_PARENT, COL_SCOPE};
    static const char *const index_what[] = {"a name index", "a track index", "a parent index", "a scope index"};
    long long tops[] = {n_names, n_tracks, n, n_scopes};
    for (int k = 0; k < 4; k++)
        for (Py_ssize_t i = 0; i < n; i++) {
            long long v = index_cols[k] == COL_SCOPE ? t.scope[i] : ((int32_t *)t.view[index_cols[k]].buf)[i];
            long long lo = index_cols[k] == COL_PARENT ? -1 : 0;
            if (v < lo || v >= tops[k]) {
                PyErr_Format(PyExc_ValueError, "event %zd has %s %lld outside %lld..%lld", i, index_what[k], v, lo,
                             tops[k] - 1);
                goto done;
            }
        }
    /* The fields of each event first (a file's records were checked so,
     * whole), then the order, and each event's children. */
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *nm = PyList_GET_ITEM(names, t.name[i]);
        if (!PyUnicode_Check(nm)) {
            PyErr_Format(PyExc_ValueError, "event %zd has a name that is not a string: %R", i, nm);
            goto done;
        }
        int64_t s = t.start[i], e = t.end[i];
        uint8_t k = t.kind[i];
        char what[160];
        if (e < s) {
            PyOS_snprintf(what, sizeof what, "ends before it starts (end_ns %lld < start_ns %lld)", (long long)e,
                          (long long)s);
            event_error(i, nm, what);
            goto done;
        }
        if (k & ~(KIND_INSTANT | FLAG_UNFINISHED | FLAG_ASYNC)) {
            PyOS_snprintf(what, sizeof what, "has kind flags %d aprof does not know", (int)k);
            event_error(i, nm, what);
            goto done;
        }
        if ((k & KIND_INSTANT) && e != s) {
            PyOS_snprintf(what, sizeof what, "is an instant with a duration (%lld ns)", (long long)(e - s));
            event_error(i, nm, what);
            goto done;
        }
        if (t.fwd[i] < 0 || t.fwd[i] >= max_tid || t.end_lt[i] < -1 || t.end_lt[i] >= max_tid) {
            if (t.end_lt[i] == -1)
                PyOS_snprintf(what, sizeof what, "names a thread outside 0..%lld (forward_thread_id %lld, end_thread_id None)",
                              max_tid - 1, (long long)t.fwd[i]);
            else
                PyOS_snprintf(what, sizeof what, "names a thread outside 0..%lld (forward_thread_id %lld, end_thread_id %lld)",
                              max_tid - 1, (long long)t.fwd[i], (long long)t.end_lt[i]);
            event_error(i, nm, what);
            goto done;
        }
    }
    if (build_children(t.parent, t.track, t.kind, n, &off, &kids) < 0)
        goto done;
    int32_t cur_track = -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *nm = PyList_GET_ITEM(names, t.name[i]);
        if (t.start[i] < profile_start) {
            event_error(i, nm, "starts before the profile started (metadata start_ns)");
            goto done;
        }
        if (t.track[i] != cur_track) {
            if (state[t.track[i]]) {
                PyObject *tid = PyObject_GetAttrString(PyList_GET_ITEM(tracks, t.track[i]), "id");
                PyObject *label = event_label(i, nm);
                if (tid != NULL && label != NULL)
                    PyErr_Format(PyExc_ValueError,
                                 "%U is on track %R, whose events came earlier: the events are not grouped by track",
                                 label, tid);
                Py_XDECREF(tid);
                Py_XDECREF(label);
                goto done;
            }
            if (cur_track >= 0)
                state[cur_track] = 1;
            cur_track = t.track[i];
        }
        else if (t.start[i] < t.start[i - 1]) {
            event_error(i, nm, "starts before the event listed before it on its track");
            goto done;
        }
        for (int32_t j = off[i]; j < off[i + 1]; j++) {
            int32_t c = kids[j];
            if (t.start[c] < t.start[i] || t.end[c] > t.end[i]) {
                PyObject *cl = event_label(c, PyList_GET_ITEM(names, t.name[c]));
                PyObject *pl = event_label(i, nm);
                if (cl != NULL && pl != NULL)
                    PyErr_Format(PyExc_ValueError, "%U is nested in %U but outside its time", cl, pl);
                Py_XDECREF(cl);
                Py_XDECREF(pl);
                goto done;
            }
        }
    }
    /* No event is its own ancestor: each chain is followed once
     * (state: 0 unseen, 1 on the chain being walked, 2 known to end). */
    memset(state, 0, (size_t)n + 1);
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t len = 0;
        int32_t cur = (int32_t)i;
        while (cur >= 0 && state[cur] != 2) {
            if (state[cur] == 1) {
                PyObject *label = event_label(cur, PyList_GET_ITEM(names, t.name[cur]));
                if (label != NULL)
                    PyErr_Format(PyExc_ValueError,
                                 t.parent[cur] == cur ? "%U is its own parent"
                                                      : "%U is its own ancestor (a cycle of parent links)",
                                 label);
                Py_XDECREF(label);
                goto done;
            }
            state[cur] = 1;
            chain[len++] = cur;
            cur = t.parent[cur];
        }
        for (Py_ssize_t k = 0; k < len; k++)
            state[chain[k]] = 2;
    }
    result = Py_NewRef(Py_None);
done:
    PyMem_Free(state);
    PyMem_Free(chain);
    PyMem_Free(off);
    PyMem_Free(kids);
    Py_XDECREF(names);
    Py_XDECREF(tracks);
    cols_release(&t);
    return result;
}

/* ------------------------------------------------------------------------ */
/* name_totals: key_averages by name, for plain ranges                       */
/* ------------------------------------------------------------------------ */

typedef struct {
    int64_t first, count, total, self, min, max;
} NameRow;

/* name_totals(tab, apart, plain_tracks, extra) -> (ids, first, count, total,
 * self, min, max, others): _analysis._by_name's sums for the plain ranges
 * (not instants; apart[scope] == 0; plain_tracks[track] != 0, i.e. no task
 * steps; not in `extra`, the sorted int32 indexes of the events with an
 * extra), one row per name id in order of first use (first: the index of
 * its first event); others the indexes of the other ranges, which the
 * caller adds one by one. A row's self time is its total less the
 * durations of its events' children. OverflowError past 64 bits. */
static PyObject *
name_totals(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "name_totals(tab, apart: bytes, plain_tracks: bytes, extra: array)");
        return NULL;
    }
    Cols t;
    if (cols_get(args[0], &t) < 0)
        return NULL;
    Py_buffer ap = {0}, pt = {0}, ex = {0};
    PyObject *names = PyObject_GetAttrString(args[0], "names");
    PyObject *ids = NULL, *others = PyList_New(0), *result = NULL;
    NameRow *rows = NULL;
    int32_t *row_of = NULL;
    uint8_t *counted = NULL;
    Py_ssize_t n_rows = 0, n = t.n;
    if (names == NULL || others == NULL || !PyList_Check(names))
        goto done;
    if (PyObject_GetBuffer(args[1], &ap, PyBUF_SIMPLE) < 0 || PyObject_GetBuffer(args[2], &pt, PyBUF_SIMPLE) < 0)
        goto done;
    Py_ssize_t n_extra = get_column(args[3], &ex, 4, "extra", 0);
    if (n_extra < 0)
        goto done;
    Py_ssize_t n_names = PyList_GET_SIZE(names);
    rows = PyMem_Malloc((size_t)(n_names > 0 ? n_names : 1) * sizeof(NameRow));
    row_of = PyMem_Malloc((size_t)(n_names > 0 ? n_names : 1) * sizeof(int32_t));
    counted = PyMem_Calloc((size_t)(n > 0 ? n : 1), 1);
    if (rows == NULL || row_of == NULL || counted == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t k = 0; k < n_names; k++)
        row_of[k] = -1;
    const uint8_t *apart = ap.buf, *plain = pt.buf;
    const int32_t *extra = ex.buf;
    Py_ssize_t epos = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        uint8_t k = t.kind[i];
        int has_extra = in_sorted(extra, n_extra, &epos, i);
        if (k & KIND_INSTANT)
            continue;
        int32_t nm = t.name[i], tr = t.track[i];
        uint8_t sc = t.scope[i];
        if (nm < 0 || nm >= n_names || tr < 0 || tr >= pt.len || sc >= ap.len) {
            PyErr_Format(PyExc_ValueError, "name_totals: event %zd has an index out of range", i);
            goto done;
        }
        int64_t d;
        if (__builtin_sub_overflow(t.end[i], t.start[i], &d))
            goto overflow;
        int32_t p = t.parent[i];
        if (p >= 0 && p < i && counted[p] && !(k & FLAG_ASYNC) && t.track[p] == tr) {
            /* a child: its time is not its parent's own time */
            NameRow *pr = &rows[row_of[t.name[p]]];
            if (__builtin_sub_overflow(pr->self, d, &pr->self))
                goto overflow;
        }
        if (has_extra || apart[sc] || !plain[tr]) {
            PyObject *ix = PyLong_FromSsize_t(i);
            if (ix == NULL || PyList_Append(others, ix) < 0) {
                Py_XDECREF(ix);
                goto done;
            }
            Py_DECREF(ix);
            continue;
        }
        int32_t row = row_of[nm];
        if (row < 0) {
            row = row_of[nm] = (int32_t)n_rows++;
            rows[row] = (NameRow){.first = i, .count = 0, .total = 0, .self = 0, .min = d, .max = d};
        }
        NameRow *r = &rows[row];
        counted[i] = 1;
        if (d < r->min)
            r->min = d;
        if (d > r->max)
            r->max = d;
        r->count++;
        if (__builtin_add_overflow(r->total, d, &r->total) || __builtin_add_overflow(r->self, d, &r->self))
            goto overflow;
    }
    ids = PyList_New(n_rows);
    if (ids == NULL)
        goto done;
    for (Py_ssize_t k = 0; k < n_names; k++)
        if (row_of[k] >= 0) {
            PyObject *o = PyLong_FromSsize_t(k);
            if (o == NULL)
                goto done;
            PyList_SET_ITEM(ids, row_of[k], o);
        }
    PyObject *cols[6];
    for (int c = 0; c < 6; c++) {
        if ((cols[c] = PyList_New(n_rows)) == NULL) {
            for (int j = 0; j < c; j++)
                Py_DECREF(cols[j]);
            goto done;
        }
        for (Py_ssize_t k = 0; k < n_rows; k++) {
            NameRow *r = &rows[k];
            int64_t v = c == 0 ? r->first : c == 1 ? r->count : c == 2 ? r->total : c == 3 ? r->self : c == 4 ? r->min : r->max;
            PyObject *o = PyLong_FromLongLong(v);
            if (o == NULL) {
                for (int j = 0; j <= c; j++)
                    Py_DECREF(cols[j]);
                goto done;
            }
            PyList_SET_ITEM(cols[c], k, o);
        }
    }
    result = Py_BuildValue("(ONNNNNNO)", ids, cols[0], cols[1], cols[2], cols[3], cols[4], cols[5], others);
    goto done;
overflow:
    PyErr_SetString(PyExc_OverflowError, "a sum of durations does not fit 64 bits");
done:
    Py_XDECREF(names);
    Py_XDECREF(ids);
    Py_XDECREF(others);
    PyMem_Free(rows);
    PyMem_Free(row_of);
    PyMem_Free(counted);
    if (ap.obj != NULL)
        PyBuffer_Release(&ap);
    if (pt.obj != NULL)
        PyBuffer_Release(&pt);
    if (ex.obj != NULL)
        PyBuffer_Release(&ex);
    cols_release(&t);
    return result;
}

/* ------------------------------------------------------------------------ */
/* consolidate_raw: records_of, sort_by_start and nest in one pass           */
/* ------------------------------------------------------------------------ */

/* One track's rows while they are paired, before they are nested: the
 * columns, whether each row's end has come, and the rare fields (five
 * owned references a row, for the rows that have any). */
typedef struct {
    Py_ssize_t n;
    int64_t *start, *end, *end_lt, *seq, *fwd;
    PyObject **name; /* borrowed: the raw list or the lead records keep them */
    int32_t *rare;
    uint8_t *scope, *kind, *open;
    PyObject **rf; /* 5 a rare row: exception, args, inputs, stack, extra */
    Py_ssize_t n_rare, cap_rare;
} Rows;

static void
rows_free(Rows *r)
{
    for (Py_ssize_t k = 0; k < r->n_rare * 5; k++)
        Py_XDECREF(r->rf[k]);
    PyMem_Free(r->rf);
    void *bufs[] = {r->start, r->end, r->end_lt, r->seq, r->fwd, r->name, r->rare, r->scope, r->kind, r->open};
    for (size_t k = 0; k < sizeof bufs / sizeof bufs[0]; k++)
        PyMem_Free(bufs[k]);
}

static int
rows_alloc(Rows *r, Py_ssize_t cap)
{
    memset(r, 0, sizeof *r);
    size_t m = cap > 0 ? (size_t)cap : 1;
    r->start = PyMem_Malloc(m * 8);
    r->end = PyMem_Malloc(m * 8);
    r->end_lt = PyMem_Malloc(m * 8);
    r->seq = PyMem_Malloc(m * 8);
    r->fwd = PyMem_Malloc(m * 8);
    r->name = PyMem_Malloc(m * sizeof(PyObject *));
    r->rare = PyMem_Malloc(m * 4);
    r->scope = PyMem_Malloc(m);
    r->kind = PyMem_Malloc(m);
    r->open = PyMem_Malloc(m);
    if (!r->start || !r->end || !r->end_lt || !r->seq || !r->fwd || !r->name || !r->rare || !r->scope || !r->kind ||
        !r->open) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

/* Row `row`'s rare field `f` (0 exception .. 4 extra), made if needed;
 * steals v. */
static int
rows_set_rare(Rows *r, Py_ssize_t row, int f, PyObject *v)
{
    if (r->rare[row] < 0) {
        if (r->n_rare == r->cap_rare) {
            Py_ssize_t cap = r->cap_rare ? r->cap_rare * 2 : 64;
            PyObject **rf = PyMem_Realloc(r->rf, (size_t)cap * 5 * sizeof(PyObject *));
            if (rf == NULL) {
                Py_DECREF(v);
                PyErr_NoMemory();
                return -1;
            }
            r->rf = rf;
            r->cap_rare = cap;
        }
        for (int k = 0; k < 5; k++)
            r->rf[r->n_rare * 5 + k] = NULL;
        r->rare[row] = (int32_t)r->n_rare++;
    }
    Py_XSETREF(r->rf[(Py_ssize_t)r->rare[row] * 5 + f], v);
    return 0;
}

/* A name's id in the table (tab._name_ids / tab.names), through a small
 * cache by address: a track's names repeat (one function, many calls). */
typedef struct {
    PyObject *key[256];
    int32_t val[256];
} NameCache;

static int
intern_name(PyObject *ids, PyObject *names, PyObject *nm, NameCache *c, int32_t *out)
{
    size_t h = hash_ptr(nm, 255);
    if (c->key[h] == nm) {
        *out = c->val[h];
        return 0;
    }
    if (!PyUnicode_Check(nm)) {
        PyErr_Format(PyExc_TypeError, "aprof: a range has a name that is not a string: %R", nm);
        return -1;
    }
    PyObject *id = PyDict_GetItemWithError(ids, nm);
    int32_t v;
    if (id == NULL) {
        if (PyErr_Occurred())
            return -1;
        Py_ssize_t k = PyList_GET_SIZE(names);
        PyObject *nid = PyLong_FromSsize_t(k);
        if (nid == NULL || PyDict_SetItem(ids, nm, nid) < 0 || PyList_Append(names, nm) < 0) {
            Py_XDECREF(nid);
            return -1;
        }
        Py_DECREF(nid);
        v = (int32_t)k;
    }
    else
        v = (int32_t)PyLong_AsLong(id);
    c->key[h] = nm; /* borrowed: the raw list keeps it alive during the call */
    c->val[h] = v;
    *out = v;
    return 0;
}

static int
scope_index(PyObject *member)
{
    for (Py_ssize_t si = 0; si < PyTuple_GET_SIZE(scope_tuple); si++)
        if (PyTuple_GET_ITEM(scope_tuple, si) == member)
            return (int)si;
    PyErr_Format(PyExc_ValueError, "aprof: a record has scope %R, not a RecordScope", member);
    return -1;
}

static inline int
as_i64(PyObject *o, int64_t *out)
{
    long long v = ll_of(o);
    if (v == -1 && PyErr_Occurred())
        return -1;
    *out = v;
    return 0;
}

/* One consolidated record (a 13-slot list) as row r->n. */
static int
rows_add_record(Rows *r, PyObject *rec)
{
    if (!PyList_CheckExact(rec) || PyList_GET_SIZE(rec) != R_SIZE) {
        PyErr_SetString(PyExc_TypeError, "aprof: a record is not a consolidated record");
        return -1;
    }
    Py_ssize_t i = r->n;
    int64_t kind;
    r->name[i] = PyList_GET_ITEM(rec, R_NAME);
    if (as_i64(PyList_GET_ITEM(rec, R_START), &r->start[i]) < 0 || as_i64(PyList_GET_ITEM(rec, R_SEQ), &r->seq[i]) < 0 ||
        as_i64(PyList_GET_ITEM(rec, R_FWD), &r->fwd[i]) < 0 || as_i64(PyList_GET_ITEM(rec, R_KIND), &kind) < 0)
        return -1;
    int si = scope_index(PyList_GET_ITEM(rec, R_SCOPE));
    if (si < 0)
        return -1;
    if (kind < 0 || kind > 255) {
        PyErr_Format(PyExc_ValueError, "aprof: a record has kind flags %lld", (long long)kind);
        return -1;
    }
    r->scope[i] = (uint8_t)si;
    r->kind[i] = (uint8_t)kind;
    r->open[i] = PyList_GET_ITEM(rec, R_END) == Py_None;
    r->end[i] = 0;
    if (!r->open[i] && as_i64(PyList_GET_ITEM(rec, R_END), &r->end[i]) < 0)
        return -1;
    r->end_lt[i] = -1;
    if (PyList_GET_ITEM(rec, R_END_LT) != Py_None && as_i64(PyList_GET_ITEM(rec, R_END_LT), &r->end_lt[i]) < 0)
        return -1;
    r->rare[i] = -1;
    r->n++;
    static const int slots[5] = {R_EXC, R_ARGS, R_INPUTS, R_STACK, R_EXTRA};
    for (int f = 0; f < 5; f++) {
        PyObject *v = PyList_GET_ITEM(rec, slots[f]);
        if (v != Py_None && rows_set_rare(r, i, f, Py_NewRef(v)) < 0)
            return -1;
    }
    return 0;
}

typedef struct {
    int64_t start;
    int32_t row;
} StartKey;

static int
cmp_start(const void *a, const void *b)
{
    const StartKey *x = a, *y = b;
    if (x->start != y->start)
        return x->start < y->start ? -1 : 1;
    return (x->row > y->row) - (x->row < y->row); /* stable: the order they came in */
}

/* ColumnStage: the columns of the tracks consolidated so far, in C, so that
 * a session of many small tracks (a task per request) makes one frombytes()
 * per column at the end, not one per column per track (_events.consolidate
 * flushes it into the table once). */
typedef struct {
    PyObject_HEAD
    char *buf[N_COLUMNS];
    Py_ssize_t n, cap; /* rows staged, rows of room */
    /* The name cache of the tracks staged (one per consolidate call cost a
     * calloc and its clearing per track), valid for the table whose
     * _name_ids is nc_ids (held: the names it caches stay alive). */
    NameCache *nc;
    PyObject *nc_ids;
} ColumnStage;

static PyTypeObject ColumnStageType;

static void
ColumnStage_dealloc(ColumnStage *st)
{
    for (int c = 0; c < N_COLUMNS; c++)
        PyMem_Free(st->buf[c]);
    PyMem_Free(st->nc);
    Py_XDECREF(st->nc_ids);
    Py_TYPE(st)->tp_free((PyObject *)st);
}

/* Append n rows of every column (out[c]: n values of its width). */
static int
stage_put(ColumnStage *st, void *const *out, Py_ssize_t n)
{
    if (st->n + n > st->cap) {
        Py_ssize_t cap = st->cap ? st->cap : 1024;
        while (cap < st->n + n)
            cap *= 2;
        for (int c = 0; c < N_COLUMNS; c++) {
            char *b = PyMem_Realloc(st->buf[c], (size_t)cap * (size_t)column_widths[c]);
            if (b == NULL) {
                PyErr_NoMemory();
                return -1;
            }
            st->buf[c] = b;
        }
        st->cap = cap;
    }
    for (int c = 0; c < N_COLUMNS; c++)
        memcpy(st->buf[c] + (size_t)st->n * (size_t)column_widths[c], out[c], (size_t)n * (size_t)column_widths[c]);
    st->n += n;
    return 0;
}

/* flush(tab): append the staged rows to the EventTable's columns; empty. */
static PyObject *
ColumnStage_flush(ColumnStage *st, PyObject *tab)
{
    for (int c = 0; c < N_COLUMNS && st->n > 0; c++) {
        PyObject *col = PyObject_GetAttrString(tab, column_attrs[c]);
        PyObject *res = col == NULL ? NULL
                                    : PyObject_CallMethod(col, "frombytes", "y#", st->buf[c],
                                                          (Py_ssize_t)(st->n * column_widths[c]));
        Py_XDECREF(col);
        if (res == NULL)
            return NULL; /* the columns may differ in length now: the table is not used after an error */
        Py_DECREF(res);
    }
    st->n = 0;
    Py_RETURN_NONE;
}

static Py_ssize_t
ColumnStage_len(ColumnStage *st)
{
    return st->n;
}

static PyMethodDef ColumnStage_methods[] = {
    {"flush", (PyCFunction)ColumnStage_flush, METH_O, "flush(tab): append the staged rows to the table's columns."},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods ColumnStage_as_sequence = {
    .sq_length = (lenfunc)ColumnStage_len,
};

static PyTypeObject ColumnStageType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "aprof._ctracer.ColumnStage",
    .tp_basicsize = sizeof(ColumnStage),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "ColumnStage()\n--\n\nRows consolidated into C buffers, flushed into an EventTable at once.",
    .tp_new = PyType_GenericNew,
    .tp_dealloc = (destructor)ColumnStage_dealloc,
    .tp_methods = ColumnStage_methods,
    .tp_as_sequence = &ColumnStage_as_sequence,
};

/* consolidate_raw(raw, tid, lead, track, stop_ns, tab, linked): the same as
 * nest(sort_by_start(lead + records_of(raw, tid))) into the EventTable `tab`
 * (see those), without building a record per range: the raw tuples are
 * paired into C arrays, ordered by start if they are not, nested, and
 * appended to the table's columns. lead holds consolidated records that go
 * first (a task's TASK record). Not for raw stacks that need naming
 * (with_stack): those go through records_of and name_stacks. */
/* The table's attributes consolidate reads, fetched once for many tracks
 * (consolidate_tracks): its length (without the staged rows), names,
 * _name_ids and rare. */
typedef struct {
    Py_ssize_t len;
    PyObject *names, *ids, *rare;
} TabRefs;

static PyObject *
consolidate(PyObject *raw, long long tid, PyObject *lead, long track, long long stop_ns, PyObject *tab,
            PyObject *linked, ColumnStage *stage, const TabRefs *pre)
{
    /* raw is one list, or a tuple of lists: a bounded profile's chunks of
     * one logical thread, oldest first (aprof/_core/_ring.py), each end
     * tuple naming its start's index in its own chunk. */
    PyObject **chunks = PyTuple_Check(raw) ? PySequence_Fast_ITEMS(raw) : &raw;
    Py_ssize_t n_chunks = PyTuple_Check(raw) ? PyTuple_GET_SIZE(raw) : 1;
    Py_ssize_t n_raw = 0, n_lead = PyList_GET_SIZE(lead), base = pre != NULL ? pre->len : PyObject_Length(tab);
    if (base < 0)
        return NULL;
    if (stage != NULL)
        base += stage->n; /* rows staged come before these */
    Py_ssize_t n_rows = n_lead; /* a block holds many ranges, a tuple one */
    for (Py_ssize_t c = 0; c < n_chunks; c++) {
        if (!PyList_CheckExact(chunks[c])) {
            PyErr_SetString(PyExc_TypeError, "consolidate_raw: raw is not a list or a tuple of lists");
            return NULL;
        }
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(chunks[c]); i++) {
            PyObject *t = PyList_GET_ITEM(chunks[c], i);
            n_rows += RangeBlock_Check(t) ? ((RangeBlock *)t)->n : 1;
        }
        n_raw += PyList_GET_SIZE(chunks[c]);
    }
    if (track < 0 || track > INT32_MAX || base + n_rows > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "aprof: more than %d events in one session", INT32_MAX);
        return NULL;
    }
    PyObject *names = pre != NULL ? Py_NewRef(pre->names) : PyObject_GetAttrString(tab, "names"),
             *ids = pre != NULL ? Py_NewRef(pre->ids) : PyObject_GetAttrString(tab, "_name_ids"),
             *rare_d = pre != NULL ? Py_NewRef(pre->rare) : PyObject_GetAttrString(tab, "rare"), *result = NULL;
    Rows r;
    int rows_ok = 0;
    int32_t *at = NULL, *order = NULL, *stack = NULL;
    int64_t *ends = NULL;
    StartKey *keys = NULL;
    void *out[N_COLUMNS] = {NULL};
    NameCache *nc = NULL, *own_nc = NULL;
    if (stage != NULL && ids != NULL) { /* the stage's, kept across its tracks (of one table) */
        if (stage->nc == NULL)
            stage->nc = PyMem_Calloc(1, sizeof(NameCache));
        else if (stage->nc_ids != ids)
            memset(stage->nc, 0, sizeof(NameCache));
        if (stage->nc != NULL && stage->nc_ids != ids)
            Py_XSETREF(stage->nc_ids, Py_NewRef(ids));
        nc = stage->nc;
    }
    else
        nc = own_nc = PyMem_Calloc(1, sizeof(NameCache));
    if (names == NULL || ids == NULL || rare_d == NULL || nc == NULL) {
        if (nc == NULL && !PyErr_Occurred())
            PyErr_NoMemory();
        goto done;
    }
    if (!PyList_Check(names) || !PyDict_Check(ids) || !PyDict_Check(rare_d)) {
        PyErr_SetString(PyExc_TypeError, "consolidate_raw: tab is not an EventTable");
        goto done;
    }
    if (rows_alloc(&r, n_rows) < 0) {
        rows_ok = 1;
        goto done;
    }
    rows_ok = 1;
    at = PyMem_Malloc((size_t)(n_raw > 0 ? n_raw : 1) * sizeof(int32_t));
    if (at == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n_lead; i++)
        if (rows_add_record(&r, PyList_GET_ITEM(lead, i)) < 0)
            goto done;
    /* Pair (records_of). */
    PyObject *last_scope_value = NULL;
    int last_scope = 0;
    Py_ssize_t chunk_base = 0;
    for (Py_ssize_t c = 0; c < n_chunks; chunk_base += PyList_GET_SIZE(chunks[c]), c++)
    for (Py_ssize_t ci = 0; ci < PyList_GET_SIZE(chunks[c]); ci++) {
        PyObject *t = PyList_GET_ITEM(chunks[c], ci);
        Py_ssize_t i = chunk_base + ci;
        if (i >= n_raw) { /* counted above; nothing runs in between that appends */
            PyErr_SetString(PyExc_RuntimeError, "aprof: a raw list grew during consolidation");
            goto done;
        }
        at[i] = -1;
        if (RangeBlock_Check(t)) { /* packed plain ranges (_cblocks.c): no end tuple names them */
            RangeBlock *b = (RangeBlock *)t;
            PyObject *member = scope_of(b->scope);
            int si = member == NULL ? -1 : scope_index(member);
            if (si < 0)
                goto done;
            if (b->n > n_rows - r.n) { /* counted above; nothing runs in between that opens a slot */
                PyErr_SetString(PyExc_RuntimeError, "aprof: a range block grew during consolidation");
                goto done;
            }
            for (Py_ssize_t k = 0, nb = b->n; k < nb; k++) {
                const BlockSlot *sl = &b->slots[k];
                Py_ssize_t row = r.n++;
                r.name[row] = sl->name;
                r.scope[row] = (uint8_t)si;
                r.start[row] = sl->start;
                r.seq[row] = -1;
                r.fwd[row] = 0;
                r.kind[row] = 0;
                r.rare[row] = -1;
                r.end_lt[row] = -1;
                r.open[row] = sl->end == BLOCK_OPEN;
                r.end[row] = r.open[row] ? 0 : sl->end;
                if (!r.open[row] && sl->end_tid != tid)
                    r.end_lt[row] = sl->end_tid == ASYNC_SAME_THREAD ? tid : sl->end_tid;
                if ((sl->args != NULL && rows_set_rare(&r, row, 1, Py_NewRef(sl->args)) < 0) ||
                    (sl->exc != NULL && rows_set_rare(&r, row, 0, Py_NewRef(sl->exc)) < 0))
                    goto done;
            }
            continue;
        }
        if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) < 4) {
            PyErr_Format(PyExc_TypeError, "aprof: raw record %zd is not a start or end tuple: %R", i, t);
            goto done;
        }
        PyObject *t0 = PyTuple_GET_ITEM(t, 0);
        if (PyLong_CheckExact(t0)) { /* (start_index, end_ns, end_thread_id, exception_name) */
            Py_ssize_t idx = PyLong_AsSsize_t(t0);
            if (idx == -1 && PyErr_Occurred())
                goto done;
            int32_t row = idx >= 0 && idx < ci ? at[chunk_base + idx] : -1;
            if (row < 0 || !r.open[row])
                continue; /* no such start, or a second end for it */
            int64_t end, end_tid;
            if (as_i64(PyTuple_GET_ITEM(t, 1), &end) < 0 || as_i64(PyTuple_GET_ITEM(t, 2), &end_tid) < 0)
                goto done;
            r.end[row] = end;
            r.open[row] = 0;
            if (end_tid != tid)
                r.end_lt[row] = end_tid == ASYNC_SAME_THREAD ? tid : end_tid;
            PyObject *exc = PyTuple_GET_ITEM(t, 3);
            if (exc != Py_None && rows_set_rare(&r, row, 0, Py_NewRef(exc)) < 0)
                goto done;
            continue;
        }
        /* a start names its range (str); see records_of */
        Py_ssize_t size = PyTuple_GET_SIZE(t), row = r.n;
        if (size != 4 && size != 5 && size != 10) {
            PyErr_Format(PyExc_TypeError, "aprof: raw start record %zd has %zd fields: %R", i, size, t);
            goto done;
        }
        PyObject *sv = PyTuple_GET_ITEM(t, 1);
        if (sv != last_scope_value) {
            PyObject *member = scope_of(sv);
            if (member == NULL)
                goto done;
            int si = scope_index(member);
            if (si < 0)
                goto done;
            last_scope_value = sv;
            last_scope = si;
        }
        r.scope[row] = (uint8_t)last_scope;
        r.name[row] = t0;
        if (as_i64(PyTuple_GET_ITEM(t, 2), &r.start[row]) < 0)
            goto done;
        r.rare[row] = -1;
        r.end_lt[row] = -1;
        r.open[row] = 1;
        r.end[row] = 0;
        r.n++;
        at[i] = (int32_t)row;
        PyObject *a = PyTuple_GET_ITEM(t, 3);
        if (a != Py_None && rows_set_rare(&r, row, 1, Py_NewRef(a)) < 0)
            goto done;
        if (size < 10) { /* the fast path's user range; 5: with its raw stack */
            r.seq[row] = -1;
            r.fwd[row] = 0;
            r.kind[row] = 0;
            if (size == 5 && PyTuple_GET_ITEM(t, 4) != Py_None &&
                rows_set_rare(&r, row, 3, Py_NewRef(PyTuple_GET_ITEM(t, 4))) < 0)
                goto done;
            continue;
        }
        /* (name, scope, start, args, seq, fwd, inputs, stack, kind, extra) */
        int64_t kind;
        if (as_i64(PyTuple_GET_ITEM(t, 4), &r.seq[row]) < 0 || as_i64(PyTuple_GET_ITEM(t, 5), &r.fwd[row]) < 0 ||
            as_i64(PyTuple_GET_ITEM(t, 8), &kind) < 0)
            goto done;
        if (kind < 0 || kind > 255) {
            PyErr_Format(PyExc_ValueError, "aprof: raw start record %zd has kind flags %lld", i, (long long)kind);
            goto done;
        }
        r.kind[row] = (uint8_t)kind;
        if (kind & KIND_INSTANT) {
            r.end[row] = r.start[row];
            r.open[row] = 0;
        }
        PyObject *inputs = PyTuple_GET_ITEM(t, 6), *stk = PyTuple_GET_ITEM(t, 7), *extra = PyTuple_GET_ITEM(t, 9);
        if ((inputs != Py_None && rows_set_rare(&r, row, 2, Py_NewRef(inputs)) < 0) ||
            (stk != Py_None && rows_set_rare(&r, row, 3, Py_NewRef(stk)) < 0))
            goto done;
        if (PyLong_CheckExact(extra)) { /* an EXECUTOR range's submit time alone */
            PyObject *d = PyDict_New();
            if (d == NULL || PyDict_SetItem(d, str_submit_ns, extra) < 0) {
                Py_XDECREF(d);
                goto done;
            }
            if (rows_set_rare(&r, row, 4, d) < 0)
                goto done;
        }
        else if (extra != Py_None && rows_set_rare(&r, row, 4, Py_NewRef(extra)) < 0)
            goto done;
    }
    PyMem_Free(at);
    at = NULL;
    Py_ssize_t n = r.n;
    /* Order by start, if they are not (sort_by_start). */
    int sorted = 1;
    for (Py_ssize_t k = 1; k < n && sorted; k++)
        sorted = r.start[k] >= r.start[k - 1];
    if (!sorted) {
        keys = PyMem_Malloc((size_t)n * sizeof(StartKey));
        order = PyMem_Malloc((size_t)n * sizeof(int32_t));
        if (keys == NULL || order == NULL) {
            PyErr_NoMemory();
            goto done;
        }
        for (Py_ssize_t k = 0; k < n; k++)
            keys[k] = (StartKey){r.start[k], (int32_t)k};
        qsort(keys, (size_t)n, sizeof(StartKey), cmp_start);
        for (Py_ssize_t k = 0; k < n; k++)
            order[k] = keys[k].row;
        PyMem_Free(keys);
        keys = NULL;
    }
    /* Nest (nest). */
    size_t m = n > 0 ? (size_t)n : 1;
    for (int c = 0; c < N_COLUMNS; c++)
        if ((out[c] = PyMem_Malloc(m * (size_t)column_widths[c])) == NULL) {
            PyErr_NoMemory();
            goto done;
        }
    stack = PyMem_Malloc(m * sizeof(int32_t));
    ends = PyMem_Malloc(m * sizeof(int64_t));
    if (stack == NULL || ends == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    int64_t *o_start = out[COL_START], *o_end = out[COL_END], *o_end_lt = out[COL_END_LT], *o_seq = out[COL_SEQ],
            *o_fwd = out[COL_FWD];
    int32_t *o_name = out[COL_NAME], *o_track = out[COL_TRACK], *o_parent = out[COL_PARENT];
    uint8_t *o_scope = out[COL_SCOPE], *o_kind = out[COL_KIND];
    Py_ssize_t depth = 0;
    for (Py_ssize_t k = 0; k < n; k++) {
        Py_ssize_t row = order != NULL ? order[k] : k;
        int32_t at_k = (int32_t)(base + k);
        int64_t start = r.start[row], end = r.end[row];
        uint8_t kind = r.kind[row];
        if (r.open[row]) { /* still open at stop */
            end = stop_ns > start ? stop_ns : start;
            kind |= FLAG_UNFINISHED;
        }
        int ended_elsewhere = r.end_lt[row] != -1, instant = (kind & KIND_INSTANT) != 0, push = 0;
        while (depth > 0 && (ends[depth - 1] < start || (ends[depth - 1] == start && !instant)))
            depth--;
        int32_t parent = -1;
        if (depth > 0) {
            parent = stack[depth - 1];
            if (ended_elsewhere || end > ends[depth - 1])
                kind |= FLAG_ASYNC;
            else
                push = !instant;
        }
        else {
            if (r.fwd[row]) {
                PyObject *ix = PyLong_FromLong(at_k);
                if (ix == NULL || PyList_Append(linked, ix) < 0) {
                    Py_XDECREF(ix);
                    goto done;
                }
                Py_DECREF(ix);
            }
            if (ended_elsewhere)
                kind |= FLAG_ASYNC;
            else
                push = !instant;
        }
        if (push) {
            stack[depth] = at_k;
            ends[depth++] = end;
        }
        o_start[k] = start;
        o_end[k] = end;
        o_end_lt[k] = r.end_lt[row];
        o_seq[k] = r.seq[row];
        o_fwd[k] = r.fwd[row];
        if (intern_name(ids, names, r.name[row], nc, &o_name[k]) < 0) /* interned in table order, as nest does */
            goto done;
        o_track[k] = (int32_t)track;
        o_parent[k] = parent;
        o_scope[k] = r.scope[row];
        o_kind[k] = kind;
        if (r.rare[row] >= 0) {
            PyObject **f = &r.rf[(Py_ssize_t)r.rare[row] * 5];
            PyObject *lst = PyList_New(5), *ix = PyLong_FromLong(at_k);
            int rc = -1;
            if (lst != NULL && ix != NULL) {
                for (int q = 0; q < 5; q++)
                    PyList_SET_ITEM(lst, q, f[q] != NULL ? Py_NewRef(f[q]) : Py_NewRef(Py_None));
                untrack_if_acyclic(lst); /* a task's: its extra is plain data (_task_events) */
                rc = PyDict_SetItem(rare_d, ix, lst);
            }
            Py_XDECREF(lst);
            Py_XDECREF(ix);
            if (rc < 0)
                goto done;
        }
    }
    if (stage != NULL) {
        if (stage_put(stage, out, n) < 0)
            goto done;
    }
    else
        for (int c = 0; c < N_COLUMNS; c++) {
            PyObject *col = PyObject_GetAttrString(tab, column_attrs[c]);
            PyObject *res = col == NULL ? NULL
                                        : PyObject_CallMethod(col, "frombytes", "y#", (const char *)out[c],
                                                              (Py_ssize_t)(n * column_widths[c]));
            Py_XDECREF(col);
            if (res == NULL)
                goto done;
            Py_DECREF(res);
        }
    result = Py_NewRef(Py_None);
done:
    if (rows_ok)
        rows_free(&r);
    for (int c = 0; c < N_COLUMNS; c++)
        PyMem_Free(out[c]);
    PyMem_Free(at);
    PyMem_Free(order);
    PyMem_Free(keys);
    PyMem_Free(stack);
    PyMem_Free(ends);
    PyMem_Free(own_nc);
    Py_XDECREF(names);
    Py_XDECREF(ids);
    Py_XDECREF(rare_d);
    return result;
}

static PyObject *
consolidate_raw(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (scope_tuple == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "aprof: _events_setup() was not called");
        return NULL;
    }
    if (nargs == 8 && args[7] != Py_None && !Py_IS_TYPE(args[7], &ColumnStageType)) {
        PyErr_SetString(PyExc_TypeError, "consolidate_raw: stage must be a ColumnStage or None");
        return NULL;
    }
    if ((nargs != 7 && nargs != 8) || !(PyList_Check(args[0]) || PyTuple_CheckExact(args[0])) ||
        !PyLong_Check(args[1]) || !PyList_Check(args[2]) ||
        !PyLong_Check(args[3]) || !PyLong_Check(args[4]) || !PyList_Check(args[6])) {
        PyErr_SetString(PyExc_TypeError, "consolidate_raw(raw: list | tuple[list, ...], tid: int, lead: list, track: int, "
                                         "stop_ns: int, "
                                         "tab: EventTable, linked: list)");
        return NULL;
    }
    long long tid = ll_of(args[1]), stop_ns = ll_of(args[4]);
    long track = PyLong_AsLong(args[3]);
    if ((tid == -1 || stop_ns == -1 || track == -1) && PyErr_Occurred())
        return NULL;
    ColumnStage *stage = nargs == 8 && args[7] != Py_None ? (ColumnStage *)args[7] : NULL;
    return consolidate(args[0], tid, args[2], track, stop_ns, args[5], args[6], stage, NULL);
}

/* consolidate_tracks(order, row_tracks, raws, leads, node_id, stop_ns, tab, linked, stage, tracks, spans)
 *
 * _events.consolidate's loop over the tracks on the one-pass path, in one
 * call (a task per request makes tens of thousands of tracks): for each k
 * in order, row_tracks[k] gets node_id, goes into tracks (by its id) and
 * the table's tracks, and its raw list raws[k] (or none) with its TASK
 * record leads[k] (or none) is consolidated into the stage (consolidate_raw);
 * spans[id] = (its first staged row, the row after its last). raws[k] and
 * leads[k] are let go (None) once written. The stage is not flushed. */
static PyObject *
consolidate_tracks(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (scope_tuple == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "aprof: _events_setup() was not called");
        return NULL;
    }
    if (nargs != 11 || !PyList_CheckExact(args[0]) || !PyList_CheckExact(args[1]) || !PyList_CheckExact(args[2]) ||
        !PyList_CheckExact(args[3]) || !PyList_Check(args[7]) || !Py_IS_TYPE(args[8], &ColumnStageType) ||
        !PyDict_CheckExact(args[9]) || !PyDict_CheckExact(args[10]) ||
        PyList_GET_SIZE(args[2]) != PyList_GET_SIZE(args[1]) || PyList_GET_SIZE(args[3]) != PyList_GET_SIZE(args[1])) {
        PyErr_SetString(PyExc_TypeError, "consolidate_tracks(order: list, row_tracks: list, raws: list, leads: list, "
                                         "node_id: int, stop_ns: int, tab: EventTable, linked: list, "
                                         "stage: ColumnStage, tracks: dict, spans: dict)");
        return NULL;
    }
    PyObject *order = args[0], *row_tracks = args[1], *raws = args[2], *leads = args[3], *node_id = args[4],
             *tab = args[6], *linked = args[7], *tracks = args[9], *spans = args[10];
    ColumnStage *stage = (ColumnStage *)args[8];
    long long stop_ns = ll_of(args[5]);
    if (stop_ns == -1 && PyErr_Occurred())
        return NULL;
    static PyObject *s_id, *s_node_id;
    if (s_node_id == NULL &&
        ((s_id = PyUnicode_InternFromString("id")) == NULL || (s_node_id = PyUnicode_InternFromString("node_id")) == NULL))
        return NULL;
    TabRefs pre = {PyObject_Length(tab), PyObject_GetAttrString(tab, "names"), PyObject_GetAttrString(tab, "_name_ids"),
                   PyObject_GetAttrString(tab, "rare")};
    PyObject *tab_tracks = PyObject_GetAttrString(tab, "tracks"), *track_ids = PyObject_GetAttrString(tab, "_track_ids");
    PyObject *empty = PyList_New(0), *one = PyList_New(1), *result = NULL;
    if (pre.len < 0 || pre.names == NULL || pre.ids == NULL || pre.rare == NULL || tab_tracks == NULL ||
        track_ids == NULL || empty == NULL || one == NULL)
        goto done;
    if (!PyList_Check(pre.names) || !PyDict_Check(pre.ids) || !PyDict_Check(pre.rare) || !PyList_Check(tab_tracks) ||
        !PyDict_Check(track_ids)) {
        PyErr_SetString(PyExc_TypeError, "consolidate_tracks: tab is not an EventTable");
        goto done;
    }
    PyList_SET_ITEM(one, 0, Py_NewRef(Py_None));
    for (Py_ssize_t q = 0; q < PyList_GET_SIZE(order); q++) {
        Py_ssize_t k = PyLong_AsSsize_t(PyList_GET_ITEM(order, q));
        if (k == -1 && PyErr_Occurred())
            goto done;
        if (k < 0 || k >= PyList_GET_SIZE(row_tracks)) {
            PyErr_SetString(PyExc_IndexError, "consolidate_tracks: an index in order is out of range");
            goto done;
        }
        PyObject *track = Py_NewRef(PyList_GET_ITEM(row_tracks, k)), *raw = Py_NewRef(PyList_GET_ITEM(raws, k)),
                 *lead = Py_NewRef(PyList_GET_ITEM(leads, k)), *tid = NULL, *key = NULL, *ti = NULL, *span = NULL;
        int ok = 0;
        /* each track's records are let go once written */
        if (PyList_SetItem(raws, k, Py_NewRef(Py_None)) < 0 || PyList_SetItem(leads, k, Py_NewRef(Py_None)) < 0)
            goto next;
        tid = PyObject_GetAttr(track, s_id);
        if (tid == NULL || PyDict_SetItem(tracks, tid, track) < 0 || PyObject_SetAttr(track, s_node_id, node_id) < 0)
            goto next;
        long long tid_v = ll_of(tid);
        if (tid_v == -1 && PyErr_Occurred())
            goto next;
        /* add_track's bookkeeping: track_ids[id(track)] = its index; tab.tracks.append(track) */
        Py_ssize_t t_index = PyList_GET_SIZE(tab_tracks);
        key = PyLong_FromVoidPtr(track);
        ti = PyLong_FromSsize_t(t_index);
        if (key == NULL || ti == NULL || PyDict_SetItem(track_ids, key, ti) < 0 || PyList_Append(tab_tracks, track) < 0)
            goto next;
        Py_ssize_t first = stage->n;
        if (lead != Py_None && PyList_SetItem(one, 0, Py_NewRef(lead)) < 0)
            goto next;
        PyObject *r = consolidate(raw == Py_None ? empty : raw, tid_v, lead == Py_None ? empty : one, (long)t_index,
                                  stop_ns, tab, linked, stage, &pre);
        if (lead != Py_None && PyList_SetItem(one, 0, Py_NewRef(Py_None)) < 0) {
            Py_XDECREF(r);
            goto next;
        }
        if (r == NULL)
            goto next;
        Py_DECREF(r);
        {
            PyObject *lo = PyLong_FromSsize_t(first), *hi = PyLong_FromSsize_t(stage->n);
            span = lo == NULL || hi == NULL ? NULL : PyTuple_Pack(2, lo, hi);
            Py_XDECREF(lo);
            Py_XDECREF(hi);
        }
        if (span == NULL || PyDict_SetItem(spans, tid, span) < 0)
            goto next;
        ok = 1;
    next:
        Py_DECREF(track);
        Py_DECREF(raw);
        Py_DECREF(lead);
        Py_XDECREF(tid);
        Py_XDECREF(key);
        Py_XDECREF(ti);
        Py_XDECREF(span);
        if (!ok)
            goto done;
    }
    result = Py_NewRef(Py_None);
done:
    Py_XDECREF(pre.names);
    Py_XDECREF(pre.ids);
    Py_XDECREF(pre.rare);
    Py_XDECREF(tab_tracks);
    Py_XDECREF(track_ids);
    Py_XDECREF(empty);
    Py_XDECREF(one);
    return result;
}

/* nest(records, track, stop_ns, tab, linked): see _events._nest. Appends
 * one track's events, from its consolidated records in start order, to the
 * EventTable `tab`: consolidate_raw with no raw tuples, the records as its
 * lead (the records are not changed). */
static PyObject *
nest(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (scope_tuple == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "aprof: _events_setup() was not called");
        return NULL;
    }
    if (nargs != 5 || !PyList_Check(args[0]) || !PyLong_Check(args[1]) || !PyLong_Check(args[2]) ||
        !PyList_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError, "nest(records: list, track: int, stop_ns: int, tab: EventTable, linked: list)");
        return NULL;
    }
    long long stop_ns = ll_of(args[2]);
    long track = PyLong_AsLong(args[1]);
    if (((stop_ns == -1 || track == -1) && PyErr_Occurred()) || check_records(args[0]) < 0)
        return NULL;
    PyObject *none = PyList_New(0);
    if (none == NULL)
        return NULL;
    PyObject *result = consolidate(none, 0, args[0], track, stop_ns, args[3], args[4], NULL, NULL);
    Py_DECREF(none);
    return result;
}

/* raw_first_start(raw) -> int or None: the earliest start among raw's start
 * tuples and blocks (a track's place in the session, before consolidate_raw). */
static PyObject *
raw_first_start(PyObject *module, PyObject *raw)
{
    PyObject **chunks = PyTuple_CheckExact(raw) ? PySequence_Fast_ITEMS(raw) : &raw;
    Py_ssize_t n_chunks = PyTuple_CheckExact(raw) ? PyTuple_GET_SIZE(raw) : 1;
    int found = 0;
    int64_t best = 0;
    for (Py_ssize_t c = 0; c < n_chunks; c++) {
    if (!PyList_Check(chunks[c])) {
        PyErr_SetString(PyExc_TypeError, "raw_first_start(raw: list | tuple[list, ...])");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(chunks[c]); i++) {
        PyObject *t = PyList_GET_ITEM(chunks[c], i);
        if (RangeBlock_Check(t)) {
            const RangeBlock *b = (const RangeBlock *)t;
            for (Py_ssize_t k = 0; k < b->n; k++)
                if (!found || b->slots[k].start < best) {
                    best = b->slots[k].start;
                    found = 1;
                }
            continue;
        }
        if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) < 4 || PyLong_CheckExact(PyTuple_GET_ITEM(t, 0)))
            continue;
        int64_t s;
        if (as_i64(PyTuple_GET_ITEM(t, 2), &s) < 0)
            return NULL;
        if (!found || s < best) {
            best = s;
            found = 1;
        }
    }
    }
    if (!found)
        Py_RETURN_NONE;
    return PyLong_FromLongLong(best);
}

/* track_rows(lists, task_tracks, task_recs, make_track, firsts, row_tracks, raws, leads)
 *
 * _events.consolidate's first loop over the raw lists, on the one-pass
 * path, in one call: for each logical thread with records, its track (its
 * task's, popped from task_tracks with its TASK record from task_recs, or
 * make_track(lt) for a thread) and its first start (raw_first_start, or
 * the TASK record's start if earlier) appended to the four lists, unless
 * it has no start at all. */
static PyObject *
track_rows(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 8 || !PyDict_Check(args[0]) || !PyDict_CheckExact(args[1]) || !PyDict_CheckExact(args[2]) ||
        !PyCallable_Check(args[3]) || !PyList_CheckExact(args[4]) || !PyList_CheckExact(args[5]) ||
        !PyList_CheckExact(args[6]) || !PyList_CheckExact(args[7])) {
        PyErr_SetString(PyExc_TypeError, "track_rows(lists: dict, task_tracks: dict, task_recs: dict, make_track, "
                                         "firsts: list, row_tracks: list, raws: list, leads: list)");
        return NULL;
    }
    PyObject *task_tracks = args[1], *task_recs = args[2], *make_track = args[3];
    static PyObject *s_id;
    if (s_id == NULL && (s_id = PyUnicode_InternFromString("id")) == NULL)
        return NULL;
    PyObject *items = PyDict_Items(args[0]); /* a snapshot of the dict */
    if (items == NULL)
        return NULL;
    PyObject *result = NULL;
    for (Py_ssize_t k = 0; k < PyList_GET_SIZE(items); k++) {
        PyObject *pair = PyList_GET_ITEM(items, k), *lt = PyTuple_GET_ITEM(pair, 0), *raw = PyTuple_GET_ITEM(pair, 1);
        int has = PyObject_IsTrue(raw);
        if (has < 0)
            goto done;
        if (!has)
            continue;
        PyObject *tid = PyObject_GetAttr(lt, s_id), *track = NULL, *rec = NULL, *first = NULL;
        int ok = 0;
        if (tid == NULL)
            goto next;
        track = PyDict_GetItemWithError(task_tracks, tid);
        if (track != NULL) { /* task_tracks.pop(tid), task_recs.pop(tid) */
            Py_INCREF(track);
            rec = PyDict_GetItemWithError(task_recs, tid);
            if (rec == NULL) {
                if (!PyErr_Occurred())
                    PyErr_SetObject(PyExc_KeyError, tid);
                goto next;
            }
            Py_INCREF(rec);
            if (PyDict_DelItem(task_tracks, tid) < 0 || PyDict_DelItem(task_recs, tid) < 0)
                goto next;
        }
        else if (PyErr_Occurred() || (track = PyObject_CallOneArg(make_track, lt)) == NULL)
            goto next;
        first = raw_first_start(module, raw);
        if (first == NULL)
            goto next;
        if (rec != NULL) { /* the TASK record's start, if earlier */
            if (!PyList_Check(rec) || PyList_GET_SIZE(rec) <= R_START) {
                PyErr_SetString(PyExc_TypeError, "track_rows: a TASK record is not a consolidated record");
                goto next;
            }
            PyObject *rs = PyList_GET_ITEM(rec, R_START);
            int earlier = first == Py_None ? 1 : PyObject_RichCompareBool(rs, first, Py_LT);
            if (earlier < 0)
                goto next;
            if (earlier)
                Py_SETREF(first, Py_NewRef(rs));
        }
        if (first != Py_None && (PyList_Append(args[4], first) < 0 || PyList_Append(args[5], track) < 0 ||
                                 PyList_Append(args[6], raw) < 0 || PyList_Append(args[7], rec ? rec : Py_None) < 0))
            goto next;
        ok = 1;
    next:
        Py_XDECREF(tid);
        Py_XDECREF(track);
        Py_XDECREF(rec);
        Py_XDECREF(first);
        if (!ok)
            goto done;
    }
    result = Py_NewRef(Py_None);
done:
    Py_DECREF(items);
    return result;
}

/* ------------------------------------------------------------------------ */
/* lod_keep, lod_merge, lod_flame: level of detail (aprof/_post/_lod.py)      */
/* ------------------------------------------------------------------------ */

/* The HTML report of a session past its detail budget holds the longest
 * events in full and the rest merged into blocks (aprof/_post/_lod.py has
 * the rules and the twins). These run once over every event of the session,
 * so at ten million events they are C: no object per event. */

/* Nested on its track, as the report draws it: neither it nor its parent is
 * async. */
#define LOD_CHILD(t, i)                                                                                          \
    ((t)->parent[i] >= 0 && (t)->track[(t)->parent[i]] == (t)->track[i] &&                                   \
     !(((t)->kind[i] | (t)->kind[(t)->parent[i]]) & FLAG_ASYNC))

static int
lod_check_parents(Cols *t)
{
    for (Py_ssize_t i = 0; i < t->n; i++)
        if (t->parent[i] < -1 || t->parent[i] >= t->n || t->track[i] < 0) {
            PyErr_Format(PyExc_ValueError, "aprof: event %zd has a parent index %d outside -1..%zd", i, t->parent[i],
                         t->n - 1);
            return -1;
        }
    return 0;
}

static inline int
bit_length(uint64_t v)
{
    return v ? 64 - __builtin_clzll(v) : 0;
}

/* lod_keep(tab, always, budget) -> (mask, rows, shortest_ns): _lod.keep_rows. */
static PyObject *
lod_keep(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyBytes_Check(args[1]) || PyBytes_GET_SIZE(args[1]) != 256 || !PyLong_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "lod_keep(tab, always: bytes (256), budget: int)");
        return NULL;
    }
    long long budget = ll_of(args[2]);
    if (budget == -1 && PyErr_Occurred())
        return NULL;
    const unsigned char *always = (const unsigned char *)PyBytes_AS_STRING(args[1]);
    Cols t;
    if (cols_get(args[0], &t) < 0)
        return NULL;
    PyObject *result = NULL, *mask = NULL;
    int32_t *rows = NULL;
    Py_ssize_t n = t.n;
    if (lod_check_parents(&t) < 0)
        goto done;
    mask = PyBytes_FromStringAndSize(NULL, n);
    rows = PyMem_Malloc((size_t)(n > 0 ? n : 1) * sizeof(int32_t));
    if (mask == NULL || rows == NULL) {
        if (rows == NULL)
            PyErr_NoMemory();
        goto done;
    }
    unsigned char *keep = (unsigned char *)PyBytes_AS_STRING(mask);
    long long buckets[66] = {0}, n_always = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (always[t.scope[i]])
            n_always++;
        else
            buckets[bit_length((uint64_t)(t.end[i] - t.start[i]))]++;
    }
    long long room = budget - n_always > 0 ? budget - n_always : 0;
    int cut = 66;
    while (cut > 0 && buckets[cut - 1] <= room) {
        cut--;
        room -= buckets[cut];
    }
    int partial = cut - 1;
    int64_t shortest = -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        keep[i] = 1;
        if (always[t.scope[i]])
            continue;
        int64_t d = t.end[i] - t.start[i];
        int b = bit_length((uint64_t)d);
        if (b < partial || (b == partial && room <= 0)) {
            keep[i] = 0;
            continue;
        }
        if (b == partial)
            room--;
        if (shortest < 0 || d < shortest)
            shortest = d;
    }
    /* Ancestors: each is set once, so this is linear in all. */
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!keep[i])
            continue;
        Py_ssize_t j = i;
        while (LOD_CHILD(&t, j) && !keep[t.parent[j]]) {
            j = t.parent[j];
            keep[j] = 1;
        }
    }
    Py_ssize_t k = 0;
    for (Py_ssize_t i = 0; i < n; i++)
        if (keep[i])
            rows[k++] = (int32_t)i;
    result = Py_BuildValue("(Oy#L)", mask, (const char *)rows, k * 4, (long long)(shortest < 0 ? 0 : shortest));
done:
    Py_XDECREF(mask);
    PyMem_Free(rows);
    cols_release(&t);
    return result;
}

/* Each event's depth of nesting (the _lod.depths rule); NULL on no memory. */
static int32_t *
lod_depths(Cols *t)
{
    Py_ssize_t n = t->n;
    int32_t *depth = PyMem_Malloc((size_t)(n > 0 ? n : 1) * sizeof(int32_t));
    int32_t *chain = PyMem_Malloc((size_t)(n > 0 ? n : 1) * sizeof(int32_t));
    if (depth == NULL || chain == NULL) {
        PyMem_Free(depth);
        PyMem_Free(chain);
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        depth[i] = -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (depth[i] >= 0)
            continue;
        Py_ssize_t len = 0, j = i;
        while (depth[j] < 0) {
            if (!LOD_CHILD(t, j)) {
                depth[j] = 0;
                break;
            }
            chain[len++] = (int32_t)j;
            j = t->parent[j];
        }
        int32_t d = depth[j];
        while (len > 0)
            depth[chain[--len]] = ++d;
    }
    PyMem_Free(chain);
    return depth;
}

typedef struct {
    int64_t start, end, count, busy;
    int open;
} LodBlock;

typedef struct {
    int64_t *p;
    Py_ssize_t len, cap;
} I64s;

static int
i64s_push(I64s *v, int64_t x)
{
    if (v->len == v->cap) {
        Py_ssize_t cap = v->cap ? v->cap * 2 : 1024;
        int64_t *p = PyMem_Realloc(v->p, (size_t)cap * sizeof(int64_t));
        if (p == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        v->p = p;
        v->cap = cap;
    }
    v->p[v->len++] = x;
    return 0;
}

static int
lod_flush(I64s *items, LodBlock *b, int64_t track, Py_ssize_t slot, int64_t base)
{
    b->open = 0;
    return i64s_push(items, track) | i64s_push(items, (int64_t)slot - 1) | i64s_push(items, b->start - base) |
           i64s_push(items, b->end - b->start) | i64s_push(items, b->count) | i64s_push(items, b->busy);
}

/* lod_merge(tab, keep, base, resolution, remap) -> (blocks, events, kept):
 * _lod.merge_rows, int64 bytes. */
static PyObject *
lod_merge(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5 || !PyBytes_Check(args[1]) || !PyLong_Check(args[2]) || !PyLong_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "lod_merge(tab, keep: bytes, base: int, resolution: int, remap)");
        return NULL;
    }
    long long base = ll_of(args[2]), resolution = ll_of(args[3]);
    if ((base == -1 || resolution == -1) && PyErr_Occurred())
        return NULL;
    if (resolution < 1) {
        PyErr_Format(PyExc_ValueError, "merge_rows: resolution must be >= 1 ns, got %lld", resolution);
        return NULL;
    }
    Cols t;
    if (cols_get(args[0], &t) < 0)
        return NULL;
    Py_buffer rv;
    Py_ssize_t nt = get_column(args[4], &rv, 4, "remap", 0);
    if (nt < 0) {
        cols_release(&t);
        return NULL;
    }
    const int32_t *remap = rv.buf;
    const unsigned char *keep = (const unsigned char *)PyBytes_AS_STRING(args[1]);
    PyObject *result = NULL;
    int32_t *depth = NULL;
    LodBlock *blocks = NULL;
    I64s items = {0};
    int64_t *events = NULL, *kept = NULL;
    Py_ssize_t n = t.n;
    if (PyBytes_GET_SIZE(args[1]) != n) {
        PyErr_Format(PyExc_ValueError, "lod_merge: keep has %zd bytes for %zd events", PyBytes_GET_SIZE(args[1]), n);
        goto done;
    }
    if (lod_check_parents(&t) < 0)
        goto done;
    for (Py_ssize_t i = 0; i < n; i++)
        if (t.track[i] >= nt) {
            PyErr_Format(PyExc_ValueError, "lod_merge: event %zd is on track %d of %zd", i, t.track[i], nt);
            goto done;
        }
    depth = lod_depths(&t);
    if (depth == NULL)
        goto done;
    int32_t max_depth = 0;
    for (Py_ssize_t i = 0; i < n; i++)
        if (depth[i] > max_depth)
            max_depth = depth[i];
    Py_ssize_t slots = (Py_ssize_t)max_depth + 2; /* 0: the async row, then depth + 1 */
    blocks = PyMem_Calloc((size_t)slots, sizeof(LodBlock));
    events = PyMem_Calloc((size_t)(nt > 0 ? nt : 1), sizeof(int64_t));
    kept = PyMem_Calloc((size_t)(nt > 0 ? nt : 1), sizeof(int64_t));
    if (blocks == NULL || events == NULL || kept == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    int32_t cur = -1;
    Py_ssize_t top = 0; /* slots below this may be open */
    for (Py_ssize_t i = 0; i < n; i++) {
        int32_t tr = t.track[i];
        if (tr != cur) {
            for (Py_ssize_t s = 0; s < top; s++)
                if (blocks[s].open && lod_flush(&items, &blocks[s], remap[cur], s, base) < 0)
                    goto done;
            top = 0;
            cur = tr;
        }
        events[tr]++;
        Py_ssize_t slot = (t.kind[i] & FLAG_ASYNC) ? 0 : (Py_ssize_t)depth[i] + 1;
        LodBlock *b = &blocks[slot];
        if (keep[i]) {
            kept[tr]++;
            if (b->open && lod_flush(&items, b, remap[cur], slot, base) < 0)
                goto done;
            continue;
        }
        int64_t s = t.start[i], e = t.end[i];
        if (b->open && s - b->end < resolution) {
            if (e > b->end)
                b->end = e;
            b->count++;
            b->busy += e - s;
            continue;
        }
        if (b->open && lod_flush(&items, b, remap[cur], slot, base) < 0)
            goto done;
        b->start = s;
        b->end = e;
        b->count = 1;
        b->busy = e - s;
        b->open = 1;
        if (slot >= top)
            top = slot + 1;
    }
    for (Py_ssize_t s = 0; s < top; s++)
        if (blocks[s].open && lod_flush(&items, &blocks[s], remap[cur], s, base) < 0)
            goto done;
    result = Py_BuildValue("(y#y#y#)", items.p != NULL ? (const char *)items.p : "", items.len * 8, (const char *)events, nt * 8,
                           (const char *)kept, nt * 8);
done:
    PyMem_Free(items.p);
    PyMem_Free(depth);
    PyMem_Free(blocks);
    PyMem_Free(events);
    PyMem_Free(kept);
    PyBuffer_Release(&rv);
    cols_release(&t);
    return result;
}

/* lod_flame(tab, label) -> (parent, label, total): _lod.range_flame, nodes
 * found by (parent node, label) in an open-addressing hash table. */
static PyObject *
lod_flame(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "lod_flame(tab, label)");
        return NULL;
    }
    Cols t;
    if (cols_get(args[0], &t) < 0)
        return NULL;
    Py_buffer lv;
    Py_ssize_t nl = get_column(args[1], &lv, 4, "label", 0);
    if (nl < 0) {
        cols_release(&t);
        return NULL;
    }
    const int32_t *label = lv.buf;
    PyObject *result = NULL;
    Py_ssize_t n = t.n;
    int32_t *node_of = NULL, *slots = NULL, *par = NULL, *lab = NULL;
    int64_t *tot = NULL;
    size_t nslots = 1024, nodes = 1, cap = 1024;
    if (nl != n) {
        PyErr_Format(PyExc_ValueError, "lod_flame: %zd labels for %zd events", nl, n);
        goto done;
    }
    if (lod_check_parents(&t) < 0)
        goto done;
    node_of = PyMem_Malloc((size_t)(n > 0 ? n : 1) * sizeof(int32_t));
    slots = PyMem_Malloc(nslots * sizeof(int32_t));
    par = PyMem_Malloc(cap * sizeof(int32_t));
    lab = PyMem_Malloc(cap * sizeof(int32_t));
    tot = PyMem_Malloc(cap * sizeof(int64_t));
    if (node_of == NULL || slots == NULL || par == NULL || lab == NULL || tot == NULL)
        goto nomem;
    memset(slots, 0xff, nslots * sizeof(int32_t)); /* -1: empty */
    par[0] = -1;
    lab[0] = -1;
    tot[0] = 0;
#define LOD_HASH(up, lb) (((uint64_t)(uint32_t)(up) * 0x9E3779B97F4A7C15ull) ^ ((uint64_t)(uint32_t)(lb) * 0xC2B2AE3D27D4EB4Full))
    for (Py_ssize_t i = 0; i < n; i++) {
        node_of[i] = -1;
        if (t.kind[i] & (FLAG_ASYNC | KIND_INSTANT))
            continue;
        int32_t p = t.parent[i];
        int32_t up = (p >= 0 && p < i && LOD_CHILD(&t, i) && node_of[p] >= 0) ? node_of[p] : 0;
        int32_t lb = label[i];
        size_t h = (size_t)(LOD_HASH(up, lb) >> 17) & (nslots - 1);
        int32_t nd;
        for (;;) {
            nd = slots[h];
            if (nd < 0 || (par[nd] == up && lab[nd] == lb))
                break;
            h = (h + 1) & (nslots - 1);
        }
        if (nd < 0) {
            if (nodes == cap) {
                cap *= 2;
                int32_t *p2 = PyMem_Realloc(par, cap * sizeof(int32_t));
                if (p2 == NULL)
                    goto nomem;
                par = p2;
                int32_t *l2 = PyMem_Realloc(lab, cap * sizeof(int32_t));
                if (l2 == NULL)
                    goto nomem;
                lab = l2;
                int64_t *t2 = PyMem_Realloc(tot, cap * sizeof(int64_t));
                if (t2 == NULL)
                    goto nomem;
                tot = t2;
            }
            nd = (int32_t)nodes++;
            par[nd] = up;
            lab[nd] = lb;
            tot[nd] = 0;
            slots[h] = nd;
            if (nodes * 2 > nslots) { /* grow and rehash: at most half full */
                size_t ns = nslots * 2;
                int32_t *s2 = PyMem_Malloc(ns * sizeof(int32_t));
                if (s2 == NULL)
                    goto nomem;
                memset(s2, 0xff, ns * sizeof(int32_t));
                for (size_t q = 1; q < nodes; q++) {
                    size_t h2 = (size_t)(LOD_HASH(par[q], lab[q]) >> 17) & (ns - 1);
                    while (s2[h2] >= 0)
                        h2 = (h2 + 1) & (ns - 1);
                    s2[h2] = (int32_t)q;
                }
                PyMem_Free(slots);
                slots = s2;
                nslots = ns;
            }
        }
        int64_t d = t.end[i] - t.start[i];
        tot[nd] += d;
        if (up == 0)
            tot[0] += d;
        node_of[i] = nd;
    }
#undef LOD_HASH
    result = Py_BuildValue("(y#y#y#)", (const char *)par, (Py_ssize_t)nodes * 4, (const char *)lab,
                           (Py_ssize_t)nodes * 4, (const char *)tot, (Py_ssize_t)nodes * 8);
    goto done;
nomem:
    PyErr_NoMemory();
done:
    PyMem_Free(node_of);
    PyMem_Free(slots);
    PyMem_Free(par);
    PyMem_Free(lab);
    PyMem_Free(tot);
    PyBuffer_Release(&lv);
    cols_release(&t);
    return result;
}
#undef LOD_CHILD

/* ------------------------------------------------------------------------ */
/* stitch_segments (aprof/_post/_stitch.py range_segments)                    */
/* ------------------------------------------------------------------------ */

/* The who-awaits-whom flame graph starts from each track's ranges cut into
 * segments by the innermost open range: one step per range of the session,
 * so it is here. Frames are tuples of names, outermost first; a range's
 * tuple is its parent's plus its own name (past max_frames, the parent's). */

/* A pointer-keyed open-addressing table (the keys are kept alive by their
 * holders): frames paths by (parent path, label), and totals by path. */
typedef struct {
    PyObject *k1, *k2, *val; /* val: a new reference (interning), or NULL */
    int64_t sum;
} PtrSlot;

typedef struct {
    PtrSlot *slot;
    size_t cap, used;
} PtrMap;

static inline size_t
ptr_hash(const void *a, const void *b)
{
    uintptr_t h = (uintptr_t)a * 0x9E3779B97F4A7C15ull ^ ((uintptr_t)b + 0x632BE59BD9B4E019ull) * 0xC2B2AE3D27D4EB4Full;
    return (size_t)(h ^ (h >> 29));
}

static void
ptrmap_free(PtrMap *m)
{
    for (size_t k = 0; k < m->cap; k++)
        if (m->slot[k].k1 != NULL) {
            Py_DECREF(m->slot[k].k1);
            Py_XDECREF(m->slot[k].k2);
            Py_XDECREF(m->slot[k].val);
        }
    PyMem_Free(m->slot);
    m->slot = NULL;
    m->cap = m->used = 0;
}

/* The slot of (k1, k2), claimed (with new references to both) if new;
 * NULL on no memory. *fresh says whether it was new. */
static PtrSlot *
ptrmap_get(PtrMap *m, PyObject *k1, PyObject *k2, int *fresh)
{
    if (2 * (m->used + 1) > m->cap) {
        size_t cap = m->cap ? 2 * m->cap : 1024;
        PtrSlot *s = PyMem_Calloc(cap, sizeof(PtrSlot));
        if (s == NULL) {
            PyErr_NoMemory();
            return NULL;
        }
        for (size_t k = 0; k < m->cap; k++)
            if (m->slot[k].k1 != NULL) {
                size_t h = ptr_hash(m->slot[k].k1, m->slot[k].k2) & (cap - 1);
                while (s[h].k1 != NULL)
                    h = (h + 1) & (cap - 1);
                s[h] = m->slot[k];
            }
        PyMem_Free(m->slot);
        m->slot = s;
        m->cap = cap;
    }
    size_t h = ptr_hash(k1, k2) & (m->cap - 1);
    while (m->slot[h].k1 != NULL) {
        if (m->slot[h].k1 == k1 && m->slot[h].k2 == k2) {
            *fresh = 0;
            return &m->slot[h];
        }
        h = (h + 1) & (m->cap - 1);
    }
    m->slot[h].k1 = Py_NewRef(k1);
    m->slot[h].k2 = Py_XNewRef(k2);
    m->slot[h].val = NULL;
    m->slot[h].sum = 0;
    m->used++;
    *fresh = 1;
    return &m->slot[h];
}

/* Add `v` to per_path[frames] (a Python int, no overflow). */
static int
dict_add(PyObject *per_path, PyObject *frames, int64_t v)
{
    PyObject *cur = PyDict_GetItemWithError(per_path, frames); /* borrowed */
    if (cur == NULL && PyErr_Occurred())
        return -1;
    PyObject *add = PyLong_FromLongLong(v);
    if (add == NULL)
        return -1;
    PyObject *sum = cur == NULL ? Py_NewRef(add) : PyNumber_Add(cur, add);
    Py_DECREF(add);
    if (sum == NULL)
        return -1;
    int rc = PyDict_SetItem(per_path, frames, sum);
    Py_DECREF(sum);
    return rc;
}

/* Time per call path, as merge_tree's first pass adds it up: a path enters
 * per_path when first seen (so the dict's order is the Python loop's), its
 * time is summed in C by the path's identity (stitch_segments hands out one
 * tuple per path, so a million segments cost no tuple hashes), and sums
 * past 64 bits go on in Python ints. */
typedef struct {
    PyObject *per_path; /* borrowed */
    PtrMap sums;
    int64_t run; /* the summed duration, not yet in `all` */
    PyObject *all;
} Totals;

static int
totals_add(Totals *T, PyObject *frames, int64_t d)
{
    int fresh;
    PtrSlot *sl = ptrmap_get(&T->sums, frames, NULL, &fresh);
    if (sl == NULL)
        return -1;
    if (fresh) {
        int has = PyDict_Contains(T->per_path, frames);
        if (has < 0 || (!has && PyDict_SetItem(T->per_path, frames, zero) < 0))
            return -1;
    }
    int64_t sum;
    if (__builtin_add_overflow(sl->sum, d, &sum)) { /* past 64 bits: into the dict's int */
        if (dict_add(T->per_path, frames, sl->sum) < 0)
            return -1;
        sum = d;
    }
    sl->sum = sum;
    if (__builtin_add_overflow(T->run, d, &sum)) {
        PyObject *r = PyLong_FromLongLong(T->run), *a = r == NULL ? NULL : PyNumber_Add(T->all, r);
        Py_XDECREF(r);
        if (a == NULL)
            return -1;
        Py_SETREF(T->all, a);
        sum = d;
    }
    T->run = sum;
    return 0;
}

/* The sums into per_path; the summed duration (NULL on error). Frees T. */
static PyObject *
totals_finish(Totals *T, int ok)
{
    PyObject *result = NULL;
    for (size_t k = 0; ok && k < T->sums.cap; k++)
        if (T->sums.slot[k].k1 != NULL && T->sums.slot[k].sum && dict_add(T->per_path, T->sums.slot[k].k1, T->sums.slot[k].sum) < 0)
            ok = 0;
    if (ok) {
        PyObject *r = PyLong_FromLongLong(T->run);
        if (r != NULL) {
            result = PyNumber_Add(T->all, r);
            Py_DECREF(r);
        }
    }
    ptrmap_free(&T->sums);
    Py_CLEAR(T->all);
    return result;
}

/* path_totals(per_path, segs) -> int
 *
 * merge_tree's first pass over one timeline: per_path[frames] += s1 - s0
 * for each (s0, s1, frames) of `segs` (see Totals); returns the summed
 * duration. */
static PyObject *
path_totals(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyDict_Check(args[0]) || !PyList_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "path_totals(per_path: dict, segs: list)");
        return NULL;
    }
    PyObject *segs = args[1];
    Totals T = {args[0], {NULL, 0, 0}, 0, PyLong_FromLong(0)};
    if (T.all == NULL)
        return NULL;
    int ok = 0;
    for (Py_ssize_t k = 0; k < PyList_GET_SIZE(segs); k++) {
        PyObject *seg = PyList_GET_ITEM(segs, k);
        if (!PyTuple_Check(seg) || PyTuple_GET_SIZE(seg) != 3) {
            PyErr_Format(PyExc_TypeError, "path_totals: segment %zd is not a (start, end, frames) tuple", k);
            goto done;
        }
        long long s0 = ll_of(PyTuple_GET_ITEM(seg, 0)), s1 = ll_of(PyTuple_GET_ITEM(seg, 1));
        if ((s0 == -1 || s1 == -1) && PyErr_Occurred())
            goto done;
        int64_t d;
        if (__builtin_sub_overflow((int64_t)s1, (int64_t)s0, &d)) {
            PyErr_SetString(PyExc_OverflowError, "path_totals: a segment's duration does not fit 64 bits");
            goto done;
        }
        if (totals_add(&T, PyTuple_GET_ITEM(seg, 2), d) < 0)
            goto done;
    }
    ok = 1;
done:
    return totals_finish(&T, ok);
}

/* Where stitch_segments puts a segment: a list, or (out NULL) Totals. */
typedef struct {
    PyObject *out;
    Totals totals;
} Sink;

static int
seg_emit(Sink *sink, int64_t t0, int64_t t1, PyObject *frames)
{
    if (sink->out == NULL)
        return totals_add(&sink->totals, frames, t1 - t0);
    PyObject *seg = PyTuple_New(3);
    if (seg == NULL)
        return -1;
    PyObject *a = PyLong_FromLongLong(t0), *b = PyLong_FromLongLong(t1);
    PyTuple_SET_ITEM(seg, 0, a);
    PyTuple_SET_ITEM(seg, 1, b);
    PyTuple_SET_ITEM(seg, 2, Py_NewRef(frames));
    if (a == NULL || b == NULL) {
        Py_DECREF(seg);
        return -1;
    }
    int rc = PyList_Append(sink->out, seg);
    Py_DECREF(seg);
    return rc;
}

/* Rows grouped by a key, in order of the key's first use: (key, bytes of
 * int32 rows) pairs. gid[i] is row i's group (-1: none), key_of(g) the key
 * object of group g. */
static PyObject *
group_rows(const int32_t *gid, Py_ssize_t n, Py_ssize_t n_groups, PyObject *(*key_of)(const void *, Py_ssize_t),
           const void *ctx)
{
    PyObject *out = NULL;
    Py_ssize_t *count = PyMem_Calloc((size_t)(n_groups > 0 ? n_groups : 1), sizeof(Py_ssize_t));
    Py_ssize_t *order = PyMem_Malloc((size_t)(n_groups > 0 ? n_groups : 1) * sizeof(Py_ssize_t));
    PyObject **bufs = PyMem_Calloc((size_t)(n_groups > 0 ? n_groups : 1), sizeof(PyObject *));
    Py_ssize_t *fill = PyMem_Calloc((size_t)(n_groups > 0 ? n_groups : 1), sizeof(Py_ssize_t));
    Py_ssize_t n_used = 0;
    if (count == NULL || order == NULL || bufs == NULL || fill == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        int32_t g = gid[i];
        if (g < 0)
            continue;
        if (count[g]++ == 0)
            order[n_used++] = g;
    }
    out = PyList_New(n_used);
    if (out == NULL)
        goto done;
    for (Py_ssize_t k = 0; k < n_used; k++) {
        Py_ssize_t g = order[k];
        bufs[g] = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(count[g] * (Py_ssize_t)sizeof(int32_t)));
        PyObject *key = bufs[g] == NULL ? NULL : key_of(ctx, g);
        if (key == NULL)
            goto fail;
        PyObject *pair = PyTuple_Pack(2, key, bufs[g]);
        Py_DECREF(key);
        if (pair == NULL)
            goto fail;
        PyList_SET_ITEM(out, k, pair);
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        int32_t g = gid[i];
        if (g >= 0)
            ((int32_t *)PyBytes_AS_STRING(bufs[g]))[fill[g]++] = (int32_t)i;
    }
    goto done;
fail:
    Py_CLEAR(out);
done:
    if (bufs != NULL)
        for (Py_ssize_t k = 0; k < n_used; k++)
            Py_XDECREF(bufs[order[k]]);
    PyMem_Free(count);
    PyMem_Free(order);
    PyMem_Free(bufs);
    PyMem_Free(fill);
    return out;
}

static PyObject *
key_index(const void *ctx, Py_ssize_t g)
{
    return PyLong_FromSsize_t(g);
}

static PyObject *
key_id(const void *ctx, Py_ssize_t g)
{
    return PyLong_FromLongLong(((const int64_t *)ctx)[g]);
}

/* stitch_setup(tab, linked, known) -> (nested, tops, roots, links)
 *
 * _stitch._Stitcher's pass over every event, as (key, bytes of int32 rows)
 * pairs in order of the key's first use: per track index, the rows of its
 * ranges (not async, not instants: nested), of its top-level ones (tops:
 * not nested on their track under a range that is not async), and of the
 * tops that are roots; per spawner id, the tops that are links (linked[scope]
 * nonzero, a sequence number > 0, and a spawner among `known`, the
 * session's track ids, ascending). _stitch._setup_rows is the twin. */
static PyObject *
stitch_setup(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyBytes_Check(args[1]) || PyBytes_GET_SIZE(args[1]) != 256) {
        PyErr_SetString(PyExc_TypeError, "stitch_setup(tab, linked: bytes (256), known: array('q'))");
        return NULL;
    }
    const unsigned char *linked = (const unsigned char *)PyBytes_AS_STRING(args[1]);
    Cols t;
    if (cols_get(args[0], &t) < 0)
        return NULL;
    Py_buffer kv;
    Py_ssize_t n_known = get_column(args[2], &kv, 8, "known", 0);
    PyObject *tracks = NULL, *result = NULL, *parts[4] = {NULL, NULL, NULL, NULL};
    int32_t *gid = NULL;
    uint8_t *cat = NULL;
    if (n_known < 0)
        goto done;
    const int64_t *known = kv.buf;
    tracks = PyObject_GetAttrString(args[0], "tracks");
    if (tracks == NULL)
        goto done;
    Py_ssize_t nt = PyObject_Length(tracks), n = t.n;
    if (nt < 0)
        goto done;
    gid = PyMem_Malloc((size_t)(n > 0 ? n : 1) * sizeof(int32_t));
    cat = PyMem_Malloc((size_t)(n > 0 ? n : 1));
    if (gid == NULL || cat == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    const uint8_t skip = FLAG_ASYNC | KIND_INSTANT;
    for (Py_ssize_t i = 0; i < n; i++) {
        int32_t tr = t.track[i], p = t.parent[i];
        if (tr < 0 || tr >= nt || p >= n) {
            PyErr_Format(PyExc_IndexError, "stitch_setup: row %zd has an index out of range", i);
            goto done;
        }
        if (t.kind[i] & skip) {
            cat[i] = 0;
            continue;
        }
        if (p >= 0 && t.track[p] == tr && !(t.kind[p] & FLAG_ASYNC)) {
            cat[i] = 1; /* nested on its track */
            continue;
        }
        cat[i] = 2; /* a root, unless it is a link */
        int64_t fwd = t.fwd[i];
        if (fwd && linked[t.scope[i]] && t.seq[i] > 0) {
            Py_ssize_t lo = 0, hi = n_known;
            while (lo < hi) {
                Py_ssize_t mid = (lo + hi) / 2;
                if (known[mid] < fwd)
                    lo = mid + 1;
                else
                    hi = mid;
            }
            if (lo < n_known && known[lo] == fwd)
                cat[i] = 3;
        }
    }
    for (int part = 0; part < 4; part++) {
        for (Py_ssize_t i = 0; i < n; i++) {
            int c = cat[i];
            int in = part == 0 ? c >= 1 : part == 1 ? c >= 2 : part == 2 ? c == 2 : c == 3;
            gid[i] = -1;
            if (in && part < 3)
                gid[i] = t.track[i];
            else if (in) { /* the spawner's place among `known` */
                Py_ssize_t lo = 0, hi = n_known;
                while (lo < hi) {
                    Py_ssize_t mid = (lo + hi) / 2;
                    if (known[mid] < t.fwd[i])
                        lo = mid + 1;
                    else
                        hi = mid;
                }
                gid[i] = (int32_t)lo;
            }
        }
        parts[part] = part < 3 ? group_rows(gid, n, nt, key_index, NULL) : group_rows(gid, n, n_known, key_id, known);
        if (parts[part] == NULL)
            goto done;
    }
    result = PyTuple_Pack(4, parts[0], parts[1], parts[2], parts[3]);
done:
    for (int part = 0; part < 4; part++)
        Py_XDECREF(parts[part]);
    Py_XDECREF(tracks);
    PyMem_Free(gid);
    PyMem_Free(cat);
    if (n_known >= 0)
        PyBuffer_Release(&kv);
    cols_release(&t);
    return result;
}

/* stitch_segments(tab, rows, a, b, labels, relabelled, max_frames[, per_path]) -> list | int
 *
 * With per_path (a dict), the segments are not made: their time goes into
 * per_path by call path as path_totals adds it, and the result is their
 * summed duration (the HTML report needs only the merged flame graph). */
static PyObject *
stitch_segments(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 7 || nargs > 8 || (nargs == 8 && !PyDict_Check(args[7])) || !PyLong_Check(args[2]) || !PyLong_Check(args[3]) ||
        !PyDict_Check(args[4]) || !PyBytes_Check(args[5]) || PyBytes_GET_SIZE(args[5]) != 256 ||
        !PyLong_Check(args[6])) {
        PyErr_SetString(PyExc_TypeError, "stitch_segments(tab, rows: list | array('i'), a: int, b: int, labels: dict, "
                                         "relabelled: bytes (256), max_frames: int[, per_path: dict])");
        return NULL;
    }
    long long a = ll_of(args[2]), b = ll_of(args[3]);
    Py_ssize_t max_frames = PyLong_AsSsize_t(args[6]);
    if (((a == -1 || b == -1) || max_frames == -1) && PyErr_Occurred())
        return NULL;
    const unsigned char *relabel = (const unsigned char *)PyBytes_AS_STRING(args[5]);
    PyObject *rows = args[1], *labels = args[4];
    int rows_listed = PyList_Check(rows);
    Py_buffer rb = {0};
    Py_ssize_t n_rows = rows_listed ? PyList_GET_SIZE(rows) : get_column(rows, &rb, 4, "rows", 0);
    if (n_rows < 0)
        return NULL;
    const int32_t *row_of = rb.buf;
    PtrMap paths = {NULL, 0, 0}; /* (parent path, label) -> path: one tuple per path, not per range */
    Cols t;
    if (cols_get(args[0], &t) < 0) {
        if (!rows_listed)
            PyBuffer_Release(&rb);
        return NULL;
    }
    PyObject *names = PyObject_GetAttrString(args[0], "names");
    PyObject *out = NULL, *empty = PyTuple_New(0);
    Sink sink = {NULL, {NULL, {NULL, 0, 0}, 0, NULL}};
    int64_t *ends = NULL;
    PyObject **frames = NULL;
    Py_ssize_t sp = 0, cap = 0;
    if (names == NULL || empty == NULL)
        goto fail;
    if (!PyList_Check(names)) {
        PyErr_SetString(PyExc_TypeError, "stitch_segments: tab.names is not a list");
        goto fail;
    }
    if (nargs == 8) {
        sink.totals.per_path = args[7];
        if ((sink.totals.all = PyLong_FromLong(0)) == NULL)
            goto fail;
        out = Py_NewRef(Py_None); /* the result comes from totals_finish */
    } else if ((sink.out = out = PyList_New(0)) == NULL)
        goto fail;
    int64_t cur = a;
    for (Py_ssize_t k = 0; k < n_rows; k++) {
        Py_ssize_t i = rows_listed ? PyLong_AsSsize_t(PyList_GET_ITEM(rows, k)) : row_of[k];
        if (i == -1 && PyErr_Occurred())
            goto fail;
        if (i < 0 || i >= t.n) {
            PyErr_Format(PyExc_IndexError, "stitch_segments: row %zd is outside 0..%zd", i, t.n - 1);
            goto fail;
        }
        int64_t s = t.start[i], e = t.end[i];
        if (e <= a || s >= b)
            continue;
        while (sp > 0 && ends[sp - 1] <= s) {
            int64_t end = ends[--sp];
            PyObject *fr = frames[sp];
            int64_t t1 = end < b ? end : b;
            int rc = t1 > cur ? seg_emit(&sink, cur, t1, fr) : 0;
            Py_DECREF(fr);
            if (rc < 0)
                goto fail;
            if (end > cur)
                cur = end;
        }
        if (sp > 0 && s > cur && seg_emit(&sink, cur, s < b ? s : b, frames[sp - 1]) < 0)
            goto fail;
        if (s > cur)
            cur = s;
        PyObject *up = sp > 0 ? frames[sp - 1] : empty, *nf;
        Py_ssize_t len = PyTuple_GET_SIZE(up);
        if (len < max_frames) {
            PyObject *label = NULL;
            if (relabel[t.scope[i]]) {
                PyObject *key = PyLong_FromSsize_t(i);
                if (key == NULL)
                    goto fail;
                label = PyDict_GetItemWithError(labels, key); /* borrowed */
                Py_DECREF(key);
                if (label == NULL && PyErr_Occurred())
                    goto fail;
            }
            if (label == NULL) {
                int32_t ni = t.name[i];
                if (ni < 0 || ni >= PyList_GET_SIZE(names)) {
                    PyErr_Format(PyExc_IndexError, "stitch_segments: row %zd has name index %d", i, ni);
                    goto fail;
                }
                label = PyList_GET_ITEM(names, ni);
            }
            int fresh;
            PtrSlot *sl = ptrmap_get(&paths, up, label, &fresh);
            if (sl == NULL)
                goto fail;
            if (fresh) {
                nf = PyTuple_New(len + 1);
                if (nf == NULL)
                    goto fail;
                for (Py_ssize_t q = 0; q < len; q++)
                    PyTuple_SET_ITEM(nf, q, Py_NewRef(PyTuple_GET_ITEM(up, q)));
                PyTuple_SET_ITEM(nf, len, Py_NewRef(label));
                sl->val = Py_NewRef(nf);
            } else
                nf = Py_NewRef(sl->val);
        } else
            nf = Py_NewRef(up);
        if (sp == cap) {
            Py_ssize_t nc = cap ? cap * 2 : 64;
            int64_t *e2 = PyMem_Realloc(ends, (size_t)nc * sizeof(int64_t));
            if (e2 != NULL)
                ends = e2;
            PyObject **f2 = e2 != NULL ? PyMem_Realloc(frames, (size_t)nc * sizeof(PyObject *)) : NULL;
            if (f2 == NULL) {
                Py_DECREF(nf);
                PyErr_NoMemory();
                goto fail;
            }
            frames = f2;
            cap = nc;
        }
        ends[sp] = e;
        frames[sp++] = nf;
    }
    while (sp > 0) {
        int64_t end = ends[--sp];
        PyObject *fr = frames[sp];
        int64_t t1 = end < b ? end : b;
        int rc = t1 > cur ? seg_emit(&sink, cur, t1, fr) : 0;
        Py_DECREF(fr);
        if (rc < 0)
            goto fail;
        if (end > cur)
            cur = end;
    }
    if (sink.out == NULL)
        Py_SETREF(out, totals_finish(&sink.totals, 1));
    goto done;
fail:
    Py_CLEAR(out);
done:
    if (sink.out == NULL && sink.totals.all != NULL)
        totals_finish(&sink.totals, 0);
    while (sp > 0)
        Py_DECREF(frames[--sp]);
    PyMem_Free(ends);
    PyMem_Free(frames);
    ptrmap_free(&paths);
    Py_XDECREF(names);
    Py_XDECREF(empty);
    if (!rows_listed)
        PyBuffer_Release(&rb);
    cols_release(&t);
    return out;
}

/* ------------------------------------------------------------------------ */
/* take_columns, many_children: what a report past its budget reads         */
/* ------------------------------------------------------------------------ */

/* take_columns(tab, keep) -> tuple of 10 bytes
 *
 * EventTable.take's columns: the rows `keep` (int32, strictly ascending)
 * of each column in COLUMNS order, a parent that is not kept -1 and a kept
 * one its new index. At ten million events, the Python twin's generator
 * per column and loop over the kept rows cost over a second. */
static PyObject *
take_columns(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "take_columns(tab, keep: array('i'))");
        return NULL;
    }
    Cols t;
    if (cols_get(args[0], &t) < 0)
        return NULL;
    Py_buffer kv;
    Py_ssize_t m = get_column(args[1], &kv, 4, "keep", 0);
    PyObject *out = NULL;
    int32_t *new_of = NULL;
    if (m < 0)
        goto done;
    const int32_t *keep = kv.buf;
    for (Py_ssize_t j = 0; j < m; j++)
        if (keep[j] < 0 || keep[j] >= t.n || (j && keep[j] <= keep[j - 1])) {
            PyErr_Format(PyExc_ValueError, "take_columns: keep[%zd] = %d is not an ascending row of the table", j,
                         keep[j]);
            goto done;
        }
    new_of = PyMem_Malloc((size_t)(t.n > 0 ? t.n : 1) * sizeof(int32_t));
    out = PyTuple_New(N_COLUMNS);
    if (new_of == NULL || out == NULL) {
        if (new_of == NULL)
            PyErr_NoMemory();
        Py_CLEAR(out);
        goto done;
    }
    for (Py_ssize_t i = 0; i < t.n; i++)
        new_of[i] = -1;
    for (Py_ssize_t j = 0; j < m; j++)
        new_of[keep[j]] = (int32_t)j;
    for (int c = 0; c < N_COLUMNS; c++) {
        int w = column_widths[c];
        PyObject *b = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(m * w));
        if (b == NULL) {
            Py_CLEAR(out);
            goto done;
        }
        char *dst = PyBytes_AS_STRING(b);
        const char *src = t.view[c].buf;
        if (c == COL_PARENT) {
            for (Py_ssize_t j = 0; j < m; j++) {
                int32_t p = t.parent[keep[j]];
                ((int32_t *)dst)[j] = p >= 0 && p < t.n ? new_of[p] : -1;
            }
        } else
            for (Py_ssize_t j = 0; j < m; j++)
                memcpy(dst + j * w, src + (Py_ssize_t)keep[j] * w, (size_t)w);
        PyTuple_SET_ITEM(out, c, b);
    }
done:
    PyMem_Free(new_of);
    if (m >= 0)
        PyBuffer_Release(&kv);
    cols_release(&t);
    return out;
}

/* many_children(off, k) -> bytes (int32 rows): the rows i with at least k
 * children, off[i + 1] - off[i] >= k (off: children_index's int32
 * offsets). The summary's repeated awaits start from these. */
static PyObject *
many_children(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "many_children(off: array('i'), k: int)");
        return NULL;
    }
    long k = PyLong_AsLong(args[1]);
    if (k == -1 && PyErr_Occurred())
        return NULL;
    Py_buffer ov;
    Py_ssize_t n = get_column(args[0], &ov, 4, "off", 0);
    if (n < 0)
        return NULL;
    const int32_t *off = ov.buf;
    Py_ssize_t found = 0;
    for (Py_ssize_t i = 0; i + 1 < n; i++)
        found += (long)off[i + 1] - off[i] >= k;
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(found * (Py_ssize_t)sizeof(int32_t)));
    if (out != NULL) {
        int32_t *rows = (int32_t *)PyBytes_AS_STRING(out);
        for (Py_ssize_t i = 0, j = 0; i + 1 < n; i++)
            if ((long)off[i + 1] - off[i] >= k)
                rows[j++] = (int32_t)i;
    }
    PyBuffer_Release(&ov);
    return out;
}

/* ------------------------------------------------------------------------ */
/* The HTML report's compact document (aprof/_post/_compact.py)              */
/* ------------------------------------------------------------------------ */

/* At a million events, building the flat event array as a list of eight
 * million ints and having json.dumps print it cost about a microsecond an
 * event; printing it from the columns costs a few nanoseconds. */

/* Decimal digits of v, as json.dumps prints an int. */
static const char digit_pairs[201] = "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
                                     "40414243444546474849505152535455565758596061626364656667686970717273747576777879"
                                     "8081828384858687888990919293949596979899";

static inline void
buf_i64(Buf *b, int64_t v) /* room (21 bytes) reserved by the caller */
{
    char tmp[24];
    int k = 24;
    uint64_t a = v < 0 ? 0ull - (uint64_t)v : (uint64_t)v;
    while (a >= 100u) { /* two digits a division */
        unsigned r = (unsigned)(a % 100u);
        a /= 100u;
        tmp[--k] = digit_pairs[2 * r + 1];
        tmp[--k] = digit_pairs[2 * r];
    }
    if (a >= 10u) {
        tmp[--k] = digit_pairs[2 * a + 1];
        tmp[--k] = digit_pairs[2 * a];
    } else
        tmp[--k] = (char)('0' + a);
    if (v < 0)
        tmp[--k] = '-';
    memcpy(b->p + b->len, tmp + k, (size_t)(24 - k));
    b->len += (size_t)(24 - k);
}

/* compact_detail_rows(tab, own) -> bytes (int32 rows, ascending)
 *
 * The rows whose compact detail says more than the columns because of a
 * column: a sequence number, a spawner, or an end on another logical
 * thread than own[track] (the track's id). The caller adds the rows with
 * rare fields (_compact._detail_rows is the twin). */
static PyObject *
compact_detail_rows(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "compact_detail_rows(tab, own: array('q'))");
        return NULL;
    }
    Cols t;
    if (cols_get(args[0], &t) < 0)
        return NULL;
    Py_buffer ov;
    Py_ssize_t n_own = get_column(args[1], &ov, 8, "own", 0);
    PyObject *result = NULL;
    int32_t *rows = NULL;
    if (n_own < 0)
        goto done;
    const int64_t *own = ov.buf;
    Py_ssize_t k = 0;
    rows = PyMem_Malloc((size_t)(t.n > 0 ? t.n : 1) * sizeof(int32_t));
    if (rows == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < t.n; i++) {
        int32_t tr = t.track[i];
        if (tr < 0 || tr >= n_own) {
            PyErr_Format(PyExc_IndexError, "compact_detail_rows: row %zd has track index %d", i, tr);
            goto done;
        }
        if (t.seq[i] != -1 || t.fwd[i] || (t.end_lt[i] != -1 && t.end_lt[i] != own[tr]))
            rows[k++] = (int32_t)i;
    }
    result = PyBytes_FromStringAndSize((const char *)rows, (Py_ssize_t)(k * (Py_ssize_t)sizeof(int32_t)));
done:
    PyMem_Free(rows);
    if (n_own >= 0)
        PyBuffer_Release(&ov);
    cols_release(&t);
    return result;
}

/* compact_events(tab, base, remap, flags, detail_rows) -> str
 *
 * The document's "events" array as json.dumps(..., separators=(",", ":"))
 * prints it: eight integers per row (remap[track], start - base, end -
 * start, parent, name, scope, flags[kind], detail), where the row
 * detail_rows[j] (ascending) has detail j and every other row -1
 * (_compact._flat_events is the twin). */
static PyObject *
compact_events(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5 || !PyBytes_Check(args[3]) || PyBytes_GET_SIZE(args[3]) != 256) {
        PyErr_SetString(PyExc_TypeError,
                        "compact_events(tab, base: int, remap: array('i'), flags: bytes (256), detail_rows: array('i'))");
        return NULL;
    }
    long long base = ll_of(args[1]);
    if (base == -1 && PyErr_Occurred())
        return NULL;
    const unsigned char *flags = (const unsigned char *)PyBytes_AS_STRING(args[3]);
    Cols t;
    if (cols_get(args[0], &t) < 0)
        return NULL;
    Py_buffer rv = {0}, dv = {0};
    PyObject *result = NULL;
    Buf b = {NULL, 0, 0};
    Py_ssize_t n_remap = get_column(args[2], &rv, 4, "remap", 0);
    Py_ssize_t n_detail = n_remap < 0 ? -1 : get_column(args[4], &dv, 4, "detail_rows", 0);
    if (n_detail < 0)
        goto done;
    const int32_t *remap = rv.buf, *detail = dv.buf;
    Py_ssize_t dpos = 0;
    if (buf_grow(&b, 2) < 0)
        goto done;
    buf_put(&b, "[", 1);
    for (Py_ssize_t i = 0; i < t.n; i++) {
        int32_t tr = t.track[i];
        if (tr < 0 || tr >= n_remap) {
            PyErr_Format(PyExc_IndexError, "compact_events: row %zd has track index %d", i, tr);
            goto done;
        }
        int64_t d = -1;
        if (dpos < n_detail && detail[dpos] < i) {
            PyErr_SetString(PyExc_ValueError, "compact_events: detail_rows are not ascending rows of the table");
            goto done;
        }
        if (dpos < n_detail && detail[dpos] == i)
            d = dpos++;
        int64_t v[8] = {remap[tr], (int64_t)((uint64_t)t.start[i] - (uint64_t)base),
                        (int64_t)((uint64_t)t.end[i] - (uint64_t)t.start[i]), t.parent[i], t.name[i],
                        t.scope[i], flags[t.kind[i]], d};
        if (buf_grow(&b, 8 * 22 + 2) < 0)
            goto done;
        for (int c = 0; c < 8; c++) {
            if (i || c)
                b.p[b.len++] = ',';
            buf_i64(&b, v[c]);
        }
    }
    if (dpos != n_detail) {
        PyErr_SetString(PyExc_ValueError, "compact_events: detail_rows are not ascending rows of the table");
        goto done;
    }
    buf_put(&b, "]", 1);
    result = PyUnicode_DecodeASCII(b.p, (Py_ssize_t)b.len, "strict");
done:
    PyMem_Free(b.p);
    if (n_remap >= 0)
        PyBuffer_Release(&rv);
    if (n_detail >= 0)
        PyBuffer_Release(&dv);
    cols_release(&t);
    return result;
}

/* first_starts(tab) -> bytes (int64 per track index)
 *
 * The start of each track's first event, for Session.tracks()' order: the
 * earliest start of the first events of its runs of rows; INT64_MAX for a
 * track with none (_session._first_start is the twin). */
static PyObject *
first_starts(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "first_starts(tab, n_tracks: int)");
        return NULL;
    }
    Py_ssize_t nt = PyLong_AsSsize_t(args[1]);
    if (nt == -1 && PyErr_Occurred())
        return NULL;
    if (nt < 0) {
        PyErr_SetString(PyExc_ValueError, "first_starts: n_tracks < 0");
        return NULL;
    }
    Cols t;
    if (cols_get(args[0], &t) < 0)
        return NULL;
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(nt * (Py_ssize_t)sizeof(int64_t)));
    if (out == NULL)
        goto done;
    int64_t *first = (int64_t *)PyBytes_AS_STRING(out);
    for (Py_ssize_t k = 0; k < nt; k++)
        first[k] = INT64_MAX;
    for (Py_ssize_t i = 0, last = -1; i < t.n; i++) {
        int32_t tr = t.track[i];
        if (tr == last) /* events come track by track in start order: a run's first is its earliest */
            continue;
        last = tr;
        if (tr < 0 || tr >= nt) {
            PyErr_Format(PyExc_IndexError, "first_starts: row %zd has track index %d", i, tr);
            Py_CLEAR(out);
            goto done;
        }
        if (t.start[i] < first[tr])
            first[tr] = t.start[i];
    }
done:
    cols_release(&t);
    return out;
}

/* trim_heap() -> bool: give the C heap's free memory back to the system
 * (glibc's malloc_trim). Consolidation frees the raw records, several
 * times the size of the columns it keeps, in blocks glibc keeps for reuse
 * in the middle of its heap; without this, the process's RSS after stop
 * stays about twice the session's size. False where there is no such call. */
static PyObject *
trim_heap(PyObject *module, PyObject *unused)
{
#ifdef __GLIBC__
    malloc_trim(0);
    Py_RETURN_TRUE;
#else
    Py_RETURN_FALSE;
#endif
}

/* _events_setup(FunctionEvent, SCOPES, scopes, start_key, layout): SCOPES
 * the scope column's RecordScopes in order, scopes {value: RecordScope};
 * layout is (R_NAME, ..., R_EXTRA, KIND_INSTANT, FLAG_UNFINISHED,
 * FLAG_ASYNC, ASYNC_SAME_THREAD) as Python defines them. */
/* task_events(records, i, stop_ns, tracks, recs, Track, task_scope, kind_range) -> next_i
 *
 * _events._task_events for the finished tasks' records (TaskRecords, or
 * the twin's 14-field tuples),
 * from records[i] on while they are: each one's Track (track.steps set)
 * in tracks[tid] and its consolidated TASK record in recs[tid], the same
 * objects, in the same order, taken off the cyclic GC's lists alike.
 * next_i is the first record not done (a running task's TaskThread, or
 * anything else, for the Python loop); a task per request makes tens of
 * thousands of them, and the loop in Python was a third of a snapshot. */
static int
task_set_slot(PyObject *track, PyObject *descr, PyObject *value)
{
    descrsetfunc set = Py_TYPE(descr)->tp_descr_set;
    return set == NULL ? (PyErr_SetString(PyExc_TypeError, "task_events: Track has no such slot"), -1)
                       : set(descr, track, value);
}

static PyObject *
task_events(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 8 || !PyList_CheckExact(args[0]) || !PyDict_CheckExact(args[3]) || !PyDict_CheckExact(args[4]) ||
        !PyType_Check(args[5])) {
        PyErr_SetString(PyExc_TypeError,
                        "task_events(records: list, i: int, stop_ns: int, tracks: dict, recs: dict, Track: type, "
                        "task_scope, kind_range: int)");
        return NULL;
    }
    PyObject *records = args[0], *stop = args[2], *tracks = args[3], *recs = args[4], *task_scope = args[6],
             *kind_range = args[7];
    PyTypeObject *track_type = (PyTypeObject *)args[5];
    Py_ssize_t i = PyLong_AsSsize_t(args[1]);
    if (i == -1 && PyErr_Occurred())
        return NULL;
    static const char *const slot_names[] = {"id", "name", "kind", "os_thread_id", "node_id", "steps"};
    PyObject *slots[6];
    for (int k = 0; k < 6; k++) { /* the slots' member descriptors (borrowed: the class holds them) */
        slots[k] = PyDict_GetItemString(track_type->tp_dict, slot_names[k]);
        if (slots[k] == NULL || Py_TYPE(slots[k]) != &PyMemberDescr_Type) {
            PyErr_Format(PyExc_TypeError, "task_events: %s has no slot %s", track_type->tp_name, slot_names[k]);
            return NULL;
        }
    }
    PyObject *zero_node = PyLong_FromLong(0);
    if (zero_node == NULL)
        return NULL;
    for (i = i < 0 ? 0 : i; i < PyList_GET_SIZE(records); i++) {
        PyObject *t = PyList_GET_ITEM(records, i);
        PyObject *const *f = aprof_record_fields(t);
        if (f == NULL)
            break;
        Py_INCREF(t); /* the list may change under a callback (a str subclass's __eq__ ...) */
        PyObject *tid = f[0], *name = f[1], *kind = f[2], *os_tid = f[3], *coro = f[4], *spawn_ns = f[5],
                 *seq = f[6], *fwd = f[7], *end_ns = f[8], *outcome = f[9], *exc = f[10], *steps = f[11],
                 *waits = f[12], *site = f[13];
        PyObject *flat = PySequence_List(steps), *extra = NULL, *rec = NULL, *track = NULL, *waits_copy = NULL;
        int ok = 0;
        if (flat == NULL)
            goto next;
        if (PyList_GET_SIZE(flat) % 2 && PyList_Append(flat, end_ns) < 0) /* finished mid-step */
            goto next;
        extra = PyDict_New();
        if (extra == NULL || PyDict_SetItem(extra, str_coro, coro) < 0 ||
            PyDict_SetItem(extra, str_spawn_ns, spawn_ns) < 0 || PyDict_SetItem(extra, str_steps, flat) < 0 ||
            PyDict_SetItem(extra, str_outcome, outcome) < 0)
            goto next;
        if (site != Py_None) {
            PyObject *s = PySequence_List(site);
            int rc = s == NULL ? -1 : PyDict_SetItem(extra, str_spawn_site, s);
            Py_XDECREF(s);
            if (rc < 0)
                goto next;
        }
        int has_waits = PyObject_IsTrue(waits);
        if (has_waits < 0)
            goto next;
        if (has_waits) { /* [run[:] for run in waits if run[0] < stop_ns] */
            PyObject *it = PyObject_GetIter(waits), *run;
            waits_copy = PyList_New(0);
            if (it == NULL || waits_copy == NULL) {
                Py_XDECREF(it);
                goto next;
            }
            while ((run = PyIter_Next(it)) != NULL) {
                PyObject *r0 = PySequence_GetItem(run, 0);
                int lt = r0 == NULL ? -1 : PyObject_RichCompareBool(r0, stop, Py_LT);
                Py_XDECREF(r0);
                PyObject *copy = lt > 0 ? PySequence_GetSlice(run, 0, PY_SSIZE_T_MAX) : NULL;
                int rc = lt < 0 || (lt > 0 && (copy == NULL || PyList_Append(waits_copy, copy) < 0)) ? -1 : 0;
                Py_XDECREF(copy);
                Py_DECREF(run);
                if (rc < 0)
                    break;
            }
            Py_DECREF(it);
            if (PyErr_Occurred() || PyDict_SetItem(extra, str_waits, waits_copy) < 0)
                goto next;
        }
        /* [name, TASK, spawn_ns, end_ns, None, exc, None, seq, fwd, None, None, KIND_RANGE, extra] */
        rec = PyList_New(R_SIZE);
        if (rec == NULL)
            goto next;
        PyObject *fields[R_SIZE] = {name, task_scope, spawn_ns, end_ns, Py_None, exc, Py_None,
                                    seq,  fwd,        Py_None,  Py_None, kind_range, extra};
        for (int k = 0; k < R_SIZE; k++)
            PyList_SET_ITEM(rec, k, Py_NewRef(fields[k]));
        track = track_type->tp_alloc(track_type, 0);
        if (track == NULL || task_set_slot(track, slots[5], Py_None) < 0 || task_set_slot(track, slots[0], tid) < 0 ||
            task_set_slot(track, slots[1], name) < 0 || task_set_slot(track, slots[2], kind) < 0 ||
            task_set_slot(track, slots[3], os_tid) < 0 || task_set_slot(track, slots[4], zero_node) < 0 ||
            task_set_slot(track, slots[5], flat) < 0)
            goto next;
        /* untrack(*extra.get("waits", ()), flat, *extra.values(), extra, track, rec): leaves first */
        if (waits_copy != NULL)
            for (Py_ssize_t k = 0; k < PyList_GET_SIZE(waits_copy); k++)
                untrack_if_acyclic(PyList_GET_ITEM(waits_copy, k));
        untrack_if_acyclic(flat);
        {
            Py_ssize_t pos = 0;
            PyObject *k, *v;
            while (PyDict_Next(extra, &pos, &k, &v))
                untrack_if_acyclic(v);
        }
        untrack_if_acyclic(extra);
        untrack_if_acyclic(track);
        untrack_if_acyclic(rec);
        ok = PyDict_SetItem(tracks, tid, track) == 0 && PyDict_SetItem(recs, tid, rec) == 0;
    next:
        Py_XDECREF(flat);
        Py_XDECREF(extra);
        Py_XDECREF(waits_copy);
        Py_XDECREF(rec);
        Py_XDECREF(track);
        Py_DECREF(t);
        if (!ok) {
            Py_DECREF(zero_node);
            return NULL;
        }
    }
    Py_DECREF(zero_node);
    return PyLong_FromSsize_t(i);
}

static PyObject *
events_setup(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5 || !PyType_Check(args[0]) || !PyTuple_CheckExact(args[1]) || !PyDict_Check(args[2]) ||
        !PyCallable_Check(args[3]) || !PyTuple_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError, "_events_setup(FunctionEvent, SCOPES, scopes, start_key, layout)");
        return NULL;
    }
    PyTypeObject *tp = (PyTypeObject *)args[0];
    if (!PyType_IsSubtype(tp, &EventViewType) || tp->tp_basicsize != EventViewType.tp_basicsize) {
        PyErr_Format(PyExc_TypeError, "aprof: %s must subclass EventView with __slots__ = ()", tp->tp_name);
        return NULL;
    }
    if (PyTuple_GET_SIZE(args[1]) > 255) {
        PyErr_SetString(PyExc_ValueError, "aprof: more scopes than the scope column holds");
        return NULL;
    }
    static const long expected[] = {R_NAME, R_SCOPE, R_START, R_END, R_END_LT, R_EXC, R_ARGS, R_SEQ, R_FWD,
                                    R_INPUTS, R_STACK, R_KIND, R_EXTRA, KIND_INSTANT, FLAG_UNFINISHED,
                                    FLAG_ASYNC, ASYNC_SAME_THREAD};
    Py_ssize_t n = (Py_ssize_t)(sizeof expected / sizeof expected[0]);
    if (PyTuple_GET_SIZE(args[4]) != n) {
        PyErr_SetString(PyExc_ValueError, "aprof: the record layout has changed; update aprof/_cevents.c");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        long v = PyLong_AsLong(PyTuple_GET_ITEM(args[4], i));
        if (v == -1 && PyErr_Occurred())
            return NULL;
        if (v != expected[i]) {
            PyErr_Format(PyExc_ValueError, "aprof: record layout constant %zd is %ld in Python, %ld in C", i, v,
                         expected[i]);
            return NULL;
        }
    }
    Py_XSETREF(scope_tuple, Py_NewRef(args[1]));
    Py_XSETREF(scopes, Py_NewRef(args[2]));
    Py_XSETREF(start_key, Py_NewRef(args[3]));
    Py_RETURN_NONE;
}

static PyMethodDef event_functions[] = {
    {"_events_setup", (PyCFunction)(void (*)(void))events_setup, METH_FASTCALL,
     "Give consolidation FunctionEvent, the scopes, the sort key and the record layout."},
    {"records_of", (PyCFunction)(void (*)(void))records_of, METH_FASTCALL,
     "Pair one logical thread's start and end tuples into consolidated records."},
    {"sort_by_start", (PyCFunction)sort_by_start, METH_O, "Sort records by start time unless already in order."},
    {"nest", (PyCFunction)(void (*)(void))nest, METH_FASTCALL,
     "Nest one track's records into an EventTable's columns (and the indexes of the top-level ones with a "
     "forward thread into linked)."},
    {"children_index", (PyCFunction)(void (*)(void))children_index, METH_FASTCALL,
     "Each event's children, from the parent, track and kind columns: (offsets, children)."},
    {"chrome_plain", (PyCFunction)(void (*)(void))chrome_plain, METH_FASTCALL,
     "The Chrome trace lines of a run of plain ranges, and the index after it."},
    {"chrome_rows", (PyCFunction)(void (*)(void))chrome_rows, METH_FASTCALL,
     "chrome_plain, and tasks' rows (their args, spawn arrows and steps); also the last flow id."},
    {"encode_column", (PyCFunction)(void (*)(void))encode_column, METH_FASTCALL,
     "A column as the binary session format stores it."},
    {"decode_column", (PyCFunction)(void (*)(void))decode_column, METH_FASTCALL,
     "A stored column decoded into an array (the binary format's reader)."},
    {"check_table", (PyCFunction)(void (*)(void))check_table, METH_FASTCALL,
     "Check an EventTable read from a file: indexes, times, flags, order, nesting, cycles."},
    {"name_totals", (PyCFunction)(void (*)(void))name_totals, METH_FASTCALL,
     "key_averages by name: the sums of the plain ranges, and the indexes of the others."},
    {"consolidate_raw", (PyCFunction)(void (*)(void))consolidate_raw, METH_FASTCALL,
     "records_of, sort_by_start and nest of one track in one pass, into an EventTable, with no record per range."},
    {"untrack_acyclic", (PyCFunction)(void (*)(void))untrack_acyclic, METH_FASTCALL,
     "untrack_acyclic(*objs): take off the cyclic GC each object that refers to nothing it tracks (leaves first)."},
    {"untrack_exempt", (PyCFunction)untrack_exempt, METH_O,
     "untrack_exempt(objs): the module-level constants untrack_acyclic may find in plain data."},
    {"raw_first_start", (PyCFunction)raw_first_start, METH_O, "The earliest start among a raw list's start tuples, or None."},
    {"lod_keep", (PyCFunction)(void (*)(void))lod_keep, METH_FASTCALL,
     "Level of detail: the events a budgeted report keeps in full (mask, rows, shortest kept)."},
    {"lod_merge", (PyCFunction)(void (*)(void))lod_merge, METH_FASTCALL,
     "Level of detail: the events not kept, merged into blocks per track and row."},
    {"lod_flame", (PyCFunction)(void (*)(void))lod_flame, METH_FASTCALL,
     "Level of detail: ranges merged by call path over every event."},
    {"stitch_segments", (PyCFunction)(void (*)(void))stitch_segments, METH_FASTCALL,
     "Who awaits whom: a track's ranges cut into segments by the innermost open range."},
    {"take_columns", (PyCFunction)(void (*)(void))take_columns, METH_FASTCALL,
     "EventTable.take's columns: the kept rows of each, parents renumbered."},
    {"many_children", (PyCFunction)(void (*)(void))many_children, METH_FASTCALL,
     "The rows with at least k children, from children_index's offsets."},
    {"compact_detail_rows", (PyCFunction)(void (*)(void))compact_detail_rows, METH_FASTCALL,
     "The HTML report's document: the rows whose detail a column calls for (int32, ascending)."},
    {"compact_events", (PyCFunction)(void (*)(void))compact_events, METH_FASTCALL,
     "The HTML report's document: its flat event array as JSON text."},
    {"first_starts", (PyCFunction)(void (*)(void))first_starts, METH_FASTCALL,
     "The start of each track's first event (int64 per track index, INT64_MAX for none)."},
    {"stitch_setup", (PyCFunction)(void (*)(void))stitch_setup, METH_FASTCALL,
     "Who awaits whom: each track's ranges, top-level ranges, roots, and each spawner's links, as rows."},
    {"path_totals", (PyCFunction)(void (*)(void))path_totals, METH_FASTCALL,
     "Who awaits whom: add a timeline's segment durations to per_path by call path; their sum."},
    {"track_rows", (PyCFunction)(void (*)(void))track_rows, METH_FASTCALL,
     "_events.consolidate's first loop over the raw lists (one-pass path): each track and its first start."},
    {"consolidate_tracks", (PyCFunction)(void (*)(void))consolidate_tracks, METH_FASTCALL,
     "_events.consolidate's loop over the tracks on the one-pass path, in one call."},
    {"task_coroutines", (PyCFunction)(void (*)(void))task_coroutines, METH_FASTCALL,
     "_chrome._task_coroutines over the table's columns: each task track's coroutine; None: left to Python."},
    {"chrome_tracks", (PyCFunction)(void (*)(void))chrome_tracks, METH_FASTCALL,
     "The Chrome trace's metadata lines of every track (names, sort order, running rows), joined."},
    {"task_events", (PyCFunction)(void (*)(void))task_events, METH_FASTCALL,
     "_events._task_events for the finished tasks' records from index i on; the first index not done."},
    {"trim_heap", trim_heap, METH_NOARGS, "Give the C heap's free memory back to the system (glibc); whether it could."},
    {NULL, NULL, 0, NULL},
};

int
aprof_events_init(PyObject *module)
{
    str_submit_ns = PyUnicode_InternFromString("submit_ns");
    str_sort = PyUnicode_InternFromString("sort");
    str_key = PyUnicode_InternFromString("key");
    minus_one = PyLong_FromLong(-1);
    zero = PyLong_FromLong(0);
    if (str_submit_ns == NULL || str_sort == NULL || str_key == NULL || minus_one == NULL || zero == NULL)
        return -1;
    for (int k = 0; k < N_TASK_ARG_KEYS; k++)
        if ((task_arg_strs[k] = PyUnicode_InternFromString(task_arg_keys[k])) == NULL)
            return -1;
    if ((str_spawn_ns = PyUnicode_InternFromString("spawn_ns")) == NULL ||
        (str_steps = PyUnicode_InternFromString("steps")) == NULL ||
        (str_coro = PyUnicode_InternFromString("coro")) == NULL ||
        (str_outcome = PyUnicode_InternFromString("outcome")) == NULL ||
        (str_spawn_site = PyUnicode_InternFromString("spawn_site")) == NULL ||
        (str_waits = PyUnicode_InternFromString("waits")) == NULL)
        return -1;
    if (PyType_Ready(&EventViewType) < 0 || PyType_Ready(&ViewCacheType) < 0 || PyType_Ready(&ColumnStageType) < 0)
        return -1;
    if (PyModule_AddObjectRef(module, "EventView", (PyObject *)&EventViewType) < 0 ||
        PyModule_AddObjectRef(module, "ViewCache", (PyObject *)&ViewCacheType) < 0 ||
        PyModule_AddObjectRef(module, "ColumnStage", (PyObject *)&ColumnStageType) < 0)
        return -1;
    return PyModule_AddFunctions(module, event_functions);
}
