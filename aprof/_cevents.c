/*
 * aprof._ctracer, third part: consolidation at stop (SPEC 6.2, 6.3).
 *
 * When a profile stops, every range's start and end tuples become one
 * consolidated record (a 13-slot list, layout R_* in
 * aprof/_core/_recorder.py) and one FunctionEvent, nested with a stack.
 * aprof/_post/_events.py holds the algorithm and its pure-Python twins
 * (_PyEventCore, _records_of, _sort_by_start, _nest); this file is the same
 * three steps in C, because at a million events the Python loops cost about
 * a microsecond per event and stop() has a budget of one second per million.
 *
 *   EventCore       FunctionEvent's four fields (_r, _t, children, parent);
 *                   FunctionEvent subclasses it with __slots__ = ().
 *   records_of()    pair one logical thread's start and end tuples.
 *   sort_by_start() put a track's records in start order if they are not.
 *   nest()          build the events of one track and link parents/children.
 *   chrome_plain()  the Chrome trace lines of a run of plain ranges (the
 *                   exporter's common case; aprof/_export/_chrome.py).
 *
 * The layout constants are checked against the Python ones once, in
 * _events_setup(), so the two cannot drift apart silently.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include "_cext.h"

/* The consolidated record's layout and flags (aprof/_core/_recorder.py). */
enum {
    R_NAME = 0, R_SCOPE, R_START, R_END, R_END_LT, R_EXC, R_ARGS, R_SEQ, R_FWD,
    R_INPUTS, R_STACK, R_KIND, R_EXTRA, R_SIZE
};
enum { KIND_INSTANT = 1, FLAG_UNFINISHED = 2, FLAG_ASYNC = 4, ASYNC_SAME_THREAD = -1 };

/* Set once by _events_setup(). */
static PyTypeObject *event_type; /* aprof._post._events.FunctionEvent */
static PyObject *no_children;    /* _events._NO_CHILDREN, shared by leaves */
static PyObject *scopes;         /* {scope value: RecordScope} */
static PyObject *start_key;      /* operator.itemgetter(R_START) */
static PyObject *str_submit_ns, *str_sort, *str_key, *minus_one, *zero;

/* ------------------------------------------------------------------------ */
/* EventCore                                                                  */
/* ------------------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    PyObject *r;        /* the consolidated record (a list) */
    PyObject *t;        /* its Track */
    PyObject *children; /* list of FunctionEvent (no_children while a leaf) */
    PyObject *parent;   /* FunctionEvent or None */
} EventCore;

static int
EventCore_traverse(EventCore *self, visitproc visit, void *arg)
{
    Py_VISIT(self->r);
    Py_VISIT(self->t);
    Py_VISIT(self->children);
    Py_VISIT(self->parent);
    return 0;
}

static int
EventCore_clear(EventCore *self)
{
    Py_CLEAR(self->r);
    Py_CLEAR(self->t);
    Py_CLEAR(self->children);
    Py_CLEAR(self->parent);
    return 0;
}

static void
EventCore_dealloc(EventCore *self)
{
    /* FunctionEvent's subtype_dealloc visits and releases the heap type and
     * guards deep trees with the trashcan; this frees the fields. */
    PyObject_GC_UnTrack(self);
    EventCore_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef EventCore_members[] = {
    {"_r", T_OBJECT_EX, offsetof(EventCore, r), 0, NULL},
    {"_t", T_OBJECT_EX, offsetof(EventCore, t), 0, NULL},
    {"children", T_OBJECT_EX, offsetof(EventCore, children), 0, "Ranges nested directly in this one, on its track."},
    {"parent", T_OBJECT_EX, offsetof(EventCore, parent), 0, "The enclosing range, or None."},
    {NULL},
};

static PyTypeObject EventCoreType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "aprof._ctracer.EventCore",
    .tp_basicsize = sizeof(EventCore),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "FunctionEvent's fields (_r, _t, children, parent), in C.",
    .tp_new = PyType_GenericNew,
    .tp_dealloc = (destructor)EventCore_dealloc,
    .tp_traverse = (traverseproc)EventCore_traverse,
    .tp_clear = (inquiry)EventCore_clear,
    .tp_members = EventCore_members,
};

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
    *out = PyLong_AsLongLong(PyList_GET_ITEM(rec, slot));
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

static inline int
or_kind(PyObject *rec, long flag)
{
    long k = PyLong_AsLong(PyList_GET_ITEM(rec, R_KIND));
    if (k == -1 && PyErr_Occurred())
        return -1;
    PyObject *v = PyLong_FromLong(k | flag);
    if (v == NULL)
        return -1;
    set_slot(rec, R_KIND, v);
    return 0;
}

static int
add_child(EventCore *parent, EventCore *child)
{
    if (parent->children == no_children) {
        PyObject *lst = PyList_New(1);
        if (lst == NULL)
            return -1;
        PyList_SET_ITEM(lst, 0, Py_NewRef(child));
        Py_SETREF(parent->children, lst);
        return 0;
    }
    return PyList_Append(parent->children, (PyObject *)child);
}

/* nest(records, track, stop_ns, events, linked): see _events._nest. */
static PyObject *
nest(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (event_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "aprof: _events_setup() was not called");
        return NULL;
    }
    if (nargs != 5 || !PyList_Check(args[0]) || !PyLong_Check(args[2]) || !PyList_Check(args[3]) ||
        !PyList_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError,
                        "nest(records: list, track: Track, stop_ns: int, events: list, linked: list)");
        return NULL;
    }
    PyObject *records = args[0], *track = args[1], *events = args[3], *linked = args[4];
    long long stop_ns = PyLong_AsLongLong(args[2]);
    if ((stop_ns == -1 && PyErr_Occurred()) || check_records(records) < 0)
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(records), depth = 0;
    /* The open ranges enclosing the current one (borrowed: each is in
     * `events`) and their end times. */
    EventCore **stack = PyMem_Malloc((n > 0 ? (size_t)n : 1) * sizeof(EventCore *));
    long long *ends = PyMem_Malloc((n > 0 ? (size_t)n : 1) * sizeof(long long));
    if (stack == NULL || ends == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *rec = PyList_GET_ITEM(records, i);
        long long start, end;
        if (get_i64(rec, R_START, &start) < 0)
            goto fail;
        if (PyList_GET_ITEM(rec, R_END) == Py_None) { /* still open at stop */
            end = stop_ns > start ? stop_ns : start;
            PyObject *v = PyLong_FromLongLong(end);
            if (v == NULL)
                goto fail;
            set_slot(rec, R_END, v);
            if (or_kind(rec, FLAG_UNFINISHED) < 0)
                goto fail;
        }
        else if (get_i64(rec, R_END, &end) < 0)
            goto fail;
        long kind = PyLong_AsLong(PyList_GET_ITEM(rec, R_KIND));
        if (kind == -1 && PyErr_Occurred())
            goto fail;
        int instant = (kind & KIND_INSTANT) != 0;
        int ended_elsewhere = PyList_GET_ITEM(rec, R_END_LT) != Py_None;

        EventCore *ev = (EventCore *)event_type->tp_alloc(event_type, 0);
        if (ev == NULL)
            goto fail;
        ev->r = Py_NewRef(rec);
        ev->t = Py_NewRef(track);
        ev->children = Py_NewRef(no_children);
        /* Pop ranges that ended before this one started. */
        while (depth > 0 && (ends[depth - 1] < start || (ends[depth - 1] == start && !instant)))
            depth--;
        int push = 0;
        if (depth > 0) {
            EventCore *parent = stack[depth - 1];
            ev->parent = Py_NewRef(parent);
            if (ended_elsewhere || end > ends[depth - 1]) {
                if (or_kind(rec, FLAG_ASYNC) < 0) /* ended elsewhere, or outlived its enclosing range */
                    goto fail_ev;
            }
            else {
                if (add_child(parent, ev) < 0)
                    goto fail_ev;
                push = !instant;
            }
        }
        else {
            ev->parent = Py_NewRef(Py_None);
            int fwd = PyObject_IsTrue(PyList_GET_ITEM(rec, R_FWD)); /* spawned or submitted work */
            if (fwd < 0 || (fwd && PyList_Append(linked, (PyObject *)ev) < 0))
                goto fail_ev;
            if (ended_elsewhere) {
                if (or_kind(rec, FLAG_ASYNC) < 0)
                    goto fail_ev;
            }
            else
                push = !instant;
        }
        if (PyList_Append(events, (PyObject *)ev) < 0)
            goto fail_ev;
        if (push) {
            stack[depth] = ev;
            ends[depth++] = end;
        }
        Py_DECREF(ev);
        continue;
    fail_ev:
        Py_DECREF(ev);
        goto fail;
    }
    PyMem_Free(stack);
    PyMem_Free(ends);
    Py_RETURN_NONE;
fail:
    PyMem_Free(stack);
    PyMem_Free(ends);
    return NULL;
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
    char tmp[32];
    unsigned long long a = ns < 0 ? 0ull - (unsigned long long)ns : (unsigned long long)ns;
    int n = snprintf(tmp, sizeof tmp, "%s%llu.%03u", ns < 0 ? "-" : "", a / 1000u, (unsigned)(a % 1000u));
    buf_put(b, tmp, (size_t)n);
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

/* chrome_plain(events, i, base, wheres, names, cats, dumps, limit)
 *     -> (text, next_i)
 *
 * The "X" lines, joined by ",\n", of events[i], events[i+1], ... while they
 * are plain ranges (no args of any kind: the test is the exporter's), at
 * most `limit` of them; next_i is the first event not written. wheres maps
 * a Track with no task steps to its '"pid":P,"tid":T'; names caches
 * dumps(name) by name; cats is ((RecordScope, cat), ...). */
static PyObject *
chrome_plain(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 8 || !PyList_Check(args[0]) || !PyDict_Check(args[3]) || !PyDict_Check(args[4]) ||
        !PyTuple_Check(args[5]) || !PyCallable_Check(args[6])) {
        PyErr_SetString(PyExc_TypeError, "chrome_plain(events, i, base, wheres, names, cats, dumps, limit)");
        return NULL;
    }
    PyObject *events = args[0], *wheres = args[3], *names = args[4], *cats = args[5], *dumps = args[6];
    Py_ssize_t i = PyLong_AsSsize_t(args[1]);
    long long base = PyLong_AsLongLong(args[2]);
    Py_ssize_t limit = PyLong_AsSsize_t(args[7]);
    if (PyErr_Occurred())
        return NULL;
    Py_ssize_t ncats = PyTuple_GET_SIZE(cats);
    Buf b = {NULL, 0, 0};
    Py_ssize_t written = 0;
    PyObject *track = NULL, *where = NULL; /* borrowed: the last event's */
    for (; i < PyList_GET_SIZE(events) && written < limit; i++) {
        PyObject *o = PyList_GET_ITEM(events, i);
        if (!PyObject_TypeCheck(o, &EventCoreType))
            break;
        EventCore *ev = (EventCore *)o;
        PyObject *r = ev->r;
        if (r == NULL || !PyList_CheckExact(r) || PyList_GET_SIZE(r) != R_SIZE || ev->t == NULL)
            break;
        if (ev->t != track) {
            where = PyDict_GetItemWithError(wheres, ev->t);
            if (where == NULL) { /* a task's track (steps to report), or an error */
                if (PyErr_Occurred())
                    goto fail;
                break;
            }
            track = ev->t;
        }
        PyObject *seq = PyList_GET_ITEM(r, R_SEQ), *fwd = PyList_GET_ITEM(r, R_FWD), *kind = PyList_GET_ITEM(r, R_KIND);
        PyObject *start = PyList_GET_ITEM(r, R_START), *end = PyList_GET_ITEM(r, R_END);
        if (PyList_GET_ITEM(r, R_ARGS) != Py_None || PyList_GET_ITEM(r, R_EXC) != Py_None ||
            PyList_GET_ITEM(r, R_END_LT) != Py_None || PyList_GET_ITEM(r, R_INPUTS) != Py_None ||
            PyList_GET_ITEM(r, R_STACK) != Py_None || PyList_GET_ITEM(r, R_EXTRA) != Py_None ||
            !PyLong_CheckExact(seq) || !PyLong_CheckExact(fwd) || !PyLong_CheckExact(kind) ||
            !PyLong_CheckExact(start) || !PyLong_CheckExact(end))
            break;
        int overflow;
        long k = PyLong_AsLongAndOverflow(kind, &overflow), f = PyLong_AsLongAndOverflow(fwd, &overflow);
        if (overflow || k != 0 || f != 0 || PyLong_AsLongAndOverflow(seq, &overflow) >= 0 || overflow)
            break;
        long long s = PyLong_AsLongLong(start), e = PyLong_AsLongLong(end);
        if (PyErr_Occurred()) {
            PyErr_Clear();
            break;
        }
        PyObject *scope = PyList_GET_ITEM(r, R_SCOPE), *cat = NULL;
        for (Py_ssize_t c = 0; c < ncats; c++) {
            PyObject *pair = PyTuple_GET_ITEM(cats, c);
            if (PyTuple_Check(pair) && PyTuple_GET_SIZE(pair) == 2 && PyTuple_GET_ITEM(pair, 0) == scope) {
                cat = PyTuple_GET_ITEM(pair, 1);
                break;
            }
        }
        if (cat == NULL)
            break;
        PyObject *name = PyList_GET_ITEM(r, R_NAME);
        PyObject *jname = PyDict_GetItemWithError(names, name); /* borrowed */
        if (jname == NULL) {
            if (PyErr_Occurred())
                goto fail;
            PyObject *d = PyObject_CallOneArg(dumps, name);
            if (d == NULL)
                goto fail;
            int rc = PyDict_SetItem(names, name, d);
            Py_DECREF(d); /* the dict keeps it */
            if (rc < 0)
                goto fail;
            jname = d;
        }
        Py_ssize_t nw, nn, nc;
        const char *w = ascii_of(where, &nw), *jn = ascii_of(jname, &nn), *ct = ascii_of(cat, &nc);
        if (w == NULL || jn == NULL || ct == NULL)
            goto fail;
        if (buf_grow(&b, (size_t)(nw + nn + nc) + 128) < 0)
            goto fail;
        if (written)
            buf_put(&b, ",\n", 2);
        buf_put(&b, "{\"ph\":\"X\",\"name\":", 17);
        buf_put(&b, jn, (size_t)nn);
        buf_put(&b, ",\"cat\":\"", 8);
        buf_put(&b, ct, (size_t)nc);
        buf_put(&b, "\",", 2);
        buf_put(&b, w, (size_t)nw);
        buf_put(&b, ",\"ts\":", 6);
        buf_us(&b, s - base);
        buf_put(&b, ",\"dur\":", 7);
        buf_us(&b, e - s);
        buf_put(&b, "}", 1);
        written++;
    }
    PyObject *text = PyUnicode_DecodeASCII(b.p ? b.p : "", (Py_ssize_t)b.len, "strict");
    PyMem_Free(b.p);
    if (text == NULL)
        return NULL;
    PyObject *out = Py_BuildValue("(Nn)", text, i);
    return out;
fail:
    PyMem_Free(b.p);
    return NULL;
}

/* ------------------------------------------------------------------------ */
/* Module glue                                                                */
/* ------------------------------------------------------------------------ */

/* ------------------------------------------------------------------------ */
/* Session columns: the binary format's writer and reader                    */
/* ------------------------------------------------------------------------ */

/* aprof/_post/_binary.py has the format and the pure-Python twins
 * (_py_columns, _py_events + validate_session). The columns are native
 * endian here; Python swaps them on a big-endian machine. */

/* Event address -> index, for one call (open addressing, never shrinks). */
typedef struct {
    const void **keys;
    int32_t *vals;
    size_t mask;
} PtrIndex;

static int
ptrindex_init(PtrIndex *m, Py_ssize_t n)
{
    size_t size = 16;
    while (size < (size_t)n * 2)
        size <<= 1;
    m->keys = PyMem_Calloc(size, sizeof(void *));
    m->vals = PyMem_Malloc(size * sizeof(int32_t));
    m->mask = size - 1;
    if (m->keys == NULL || m->vals == NULL) {
        PyMem_Free(m->keys);
        PyMem_Free(m->vals);
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static void
ptrindex_put(PtrIndex *m, const void *key, int32_t val)
{
    size_t j = hash_ptr(key, m->mask);
    while (m->keys[j] != NULL && m->keys[j] != key)
        j = (j + 1) & m->mask;
    m->keys[j] = key;
    m->vals[j] = val;
}

static int32_t
ptrindex_get(const PtrIndex *m, const void *key)
{
    size_t j = hash_ptr(key, m->mask);
    while (m->keys[j] != NULL) {
        if (m->keys[j] == key)
            return m->vals[j];
        j = (j + 1) & m->mask;
    }
    return -1;
}

static void
ptrindex_free(PtrIndex *m)
{
    PyMem_Free(m->keys);
    PyMem_Free(m->vals);
}

/* An int slot of a record as int64; a clear error for anything else. */
static int
slot_i64(PyObject *rec, Py_ssize_t slot, Py_ssize_t i, const char *field, int64_t *out)
{
    PyObject *v = PyList_GET_ITEM(rec, slot);
    if (!PyLong_Check(v)) {
        PyErr_Format(PyExc_ValueError, "event %zd has %s %R, not an integer", i, field, v);
        return -1;
    }
    long long x = PyLong_AsLongLong(v);
    if (x == -1 && PyErr_Occurred())
        return -1;
    *out = x;
    return 0;
}

#define N_COLUMNS 10
static const int column_widths[N_COLUMNS] = {8, 8, 8, 8, 8, 4, 4, 4, 1, 1};
enum { COL_START, COL_END, COL_END_LT, COL_SEQ, COL_FWD, COL_NAME, COL_TRACK, COL_PARENT, COL_SCOPE, COL_KIND };

/* A column as the file stores it (_binary.py, "Columns"): each value
 * less the one before it (COL_START) or less its start (COL_END), modulo
 * 2**64, then byte-shuffled: byte 0 (the least significant) of every
 * value, then byte 1, and so on, so the high bytes, nearly all equal,
 * make long runs that zlib packs small and fast. */
static PyObject *
encode_column(const void *vals, const int64_t *starts, Py_ssize_t n, int c)
{
    int width = column_widths[c];
    PyObject *out = PyBytes_FromStringAndSize(NULL, n * width);
    if (out == NULL)
        return NULL;
    uint8_t *o = (uint8_t *)PyBytes_AS_STRING(out);
    if (width == 1) {
        memcpy(o, vals, (size_t)n);
        return out;
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
    return out;
}

/* encode_column undone, into vals (n values of the column's width). */
static void
decode_column(const uint8_t *in, void *vals, const int64_t *starts, Py_ssize_t n, int c)
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

/* session_columns(events, track_index, scopes, encode) -> (start_ns,
 * end_ns, end_thread_id, sequence_nr, forward_thread_id, name, track,
 * parent, scope, kind, names, rare): the first ten the column blocks, as
 * the file stores them (encode_column) or, without encode, as plain native
 * arrays (for the exporters), names the distinct names in order of first
 * use, rare the indexes of the events with an exception, args, inputs,
 * stack or extra. track_index maps each Track to its index; scopes lists
 * the RecordScope members, in the order the scope column counts them. */
static PyObject *
session_columns(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 || !PyList_Check(args[0]) || !PyDict_Check(args[1]) || !PyList_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError,
                         "session_columns(events: list, track_index: dict, scopes: list, encode: bool)");
        return NULL;
    }
    PyObject *events = args[0], *track_index = args[1], *scope_list = args[2];
    int encode = PyObject_IsTrue(args[3]);
    if (encode < 0)
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(events);
    if (n > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "%zd events are more than the format's %d", n, INT32_MAX);
        return NULL;
    }
    PyObject *cols[N_COLUMNS] = {NULL};
    void *buf[N_COLUMNS] = {NULL};
    PyObject *names = PyList_New(0), *name_ids = PyDict_New(), *rare = PyList_New(0), *result = NULL;
    PtrIndex index = {NULL, NULL, 0}; /* built on first need */
    if (names == NULL || name_ids == NULL || rare == NULL)
        goto done;
    for (int c = 0; c < N_COLUMNS; c++)
        if ((buf[c] = PyMem_Malloc((size_t)(n > 0 ? n : 1) * (size_t)column_widths[c])) == NULL) {
            PyErr_NoMemory();
            goto done;
        }
    int64_t *start = buf[COL_START], *end = buf[COL_END], *end_lt = buf[COL_END_LT], *seq = buf[COL_SEQ],
            *fwd = buf[COL_FWD];
    int32_t *name = buf[COL_NAME], *track = buf[COL_TRACK], *parent = buf[COL_PARENT];
    uint8_t *scope = buf[COL_SCOPE], *kind = buf[COL_KIND];
    Py_ssize_t n_scopes = PyList_GET_SIZE(scope_list);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *ev = PyList_GET_ITEM(events, i);
        if (!PyObject_TypeCheck(ev, &EventCoreType)) {
            PyErr_Format(PyExc_TypeError, "event %zd is a %.100s, not a FunctionEvent", i, Py_TYPE(ev)->tp_name);
            goto done;
        }
    }
    PyObject *last_track = NULL;
    int32_t last_track_id = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        EventCore *ev = (EventCore *)PyList_GET_ITEM(events, i);
        PyObject *rec = ev->r;
        if (rec == NULL || !PyList_CheckExact(rec) || PyList_GET_SIZE(rec) != R_SIZE) {
            PyErr_Format(PyExc_ValueError, "event %zd has a record of the wrong shape", i);
            goto done;
        }
        if (slot_i64(rec, R_START, i, "start_ns", &start[i]) < 0 || slot_i64(rec, R_END, i, "end_ns", &end[i]) < 0 ||
            slot_i64(rec, R_SEQ, i, "sequence_nr", &seq[i]) < 0 ||
            slot_i64(rec, R_FWD, i, "forward_thread_id", &fwd[i]) < 0)
            goto done;
        if (PyList_GET_ITEM(rec, R_END_LT) == Py_None)
            end_lt[i] = -1;
        else if (slot_i64(rec, R_END_LT, i, "end_thread_id", &end_lt[i]) < 0)
            goto done;
        int64_t k;
        if (slot_i64(rec, R_KIND, i, "kind", &k) < 0)
            goto done;
        if (k < 0 || k > 255) {
            PyErr_Format(PyExc_ValueError, "event %zd has kind flags %lld aprof does not know", i, (long long)k);
            goto done;
        }
        kind[i] = (uint8_t)k;
        /* the name, interned */
        PyObject *nm = PyList_GET_ITEM(rec, R_NAME);
        if (!PyUnicode_Check(nm)) {
            PyErr_Format(PyExc_ValueError, "event %zd has a name that is not a string: %R", i, nm);
            goto done;
        }
        PyObject *id = PyDict_GetItemWithError(name_ids, nm);
        if (id == NULL) {
            if (PyErr_Occurred())
                goto done;
            PyObject *nid = PyLong_FromSsize_t(PyList_GET_SIZE(names));
            if (nid == NULL || PyDict_SetItem(name_ids, nm, nid) < 0 || PyList_Append(names, nm) < 0) {
                Py_XDECREF(nid);
                goto done;
            }
            name[i] = (int32_t)(PyList_GET_SIZE(names) - 1);
            Py_DECREF(nid);
        }
        else
            name[i] = (int32_t)PyLong_AsLong(id);
        /* the scope (its index in scope_list: a few members, compared by
         * identity, not through the enum's Python __hash__) and the track */
        PyObject *sc = PyList_GET_ITEM(rec, R_SCOPE);
        Py_ssize_t si = 0;
        while (si < n_scopes && PyList_GET_ITEM(scope_list, si) != sc)
            si++;
        if (si == n_scopes || si > 255) {
            PyErr_Format(PyExc_ValueError, "event %zd has scope %R, not a RecordScope", i, sc);
            goto done;
        }
        scope[i] = (uint8_t)si;
        if (ev->t != last_track) {
            PyObject *ti = ev->t == NULL ? NULL : PyDict_GetItemWithError(track_index, ev->t);
            if (ti == NULL) {
                if (!PyErr_Occurred())
                    PyErr_Format(PyExc_ValueError, "event %zd is on a track the session does not list", i);
                goto done;
            }
            last_track = ev->t;
            last_track_id = (int32_t)PyLong_AsLong(ti);
        }
        track[i] = last_track_id;
        /* The parent, as an index: a nested range's is the event before
         * it or one of that one's ancestors (a walk of a few steps, where a
         * table lookup would miss the cache); a spawned task's or an async
         * range's, on another track, is looked up in a table of all. The
         * walk follows parent[] only where it is filled in, below i: an
         * event's parent on another track may come later in the list. */
        parent[i] = -1;
        if (ev->parent != NULL && ev->parent != Py_None) {
            int32_t j = (int32_t)i - 1;
            for (int steps = 0; j >= 0 && j < i && steps < 32; steps++, j = parent[j])
                if (PyList_GET_ITEM(events, j) == ev->parent)
                    break;
            if (j >= 0 && j < i && PyList_GET_ITEM(events, j) == ev->parent)
                parent[i] = j;
            else {
                if (index.keys == NULL) {
                    if (ptrindex_init(&index, n) < 0)
                        goto done;
                    for (Py_ssize_t k = 0; k < n; k++)
                        ptrindex_put(&index, PyList_GET_ITEM(events, k), (int32_t)k);
                }
                if ((parent[i] = ptrindex_get(&index, ev->parent)) < 0) {
                    PyErr_Format(PyExc_ValueError, "event %zd has a parent that is not an event of this session", i);
                    goto done;
                }
            }
        }
        if (PyList_GET_ITEM(rec, R_EXC) != Py_None || PyList_GET_ITEM(rec, R_ARGS) != Py_None ||
            PyList_GET_ITEM(rec, R_INPUTS) != Py_None || PyList_GET_ITEM(rec, R_STACK) != Py_None ||
            PyList_GET_ITEM(rec, R_EXTRA) != Py_None) {
            PyObject *ix = PyLong_FromSsize_t(i);
            if (ix == NULL || PyList_Append(rare, ix) < 0) {
                Py_XDECREF(ix);
                goto done;
            }
            Py_DECREF(ix);
        }
    }
    for (int c = 0; c < N_COLUMNS; c++) {
        cols[c] = encode ? encode_column(buf[c], start, n, c)
                         : PyBytes_FromStringAndSize((const char *)buf[c], n * column_widths[c]);
        if (cols[c] == NULL)
            goto done;
    }
    result = PyTuple_New(N_COLUMNS + 2);
    if (result == NULL)
        goto done;
    for (int c = 0; c < N_COLUMNS; c++) {
        PyTuple_SET_ITEM(result, c, cols[c]);
        cols[c] = NULL;
    }
    PyTuple_SET_ITEM(result, N_COLUMNS, Py_NewRef(names));
    PyTuple_SET_ITEM(result, N_COLUMNS + 1, Py_NewRef(rare));
done:
    for (int c = 0; c < N_COLUMNS; c++) {
        Py_XDECREF(cols[c]);
        PyMem_Free(buf[c]);
    }
    Py_XDECREF(names);
    Py_XDECREF(name_ids);
    Py_XDECREF(rare);
    ptrindex_free(&index);
    return result;
}

/* A column argument: bytes of exactly n * width bytes. */
static const char *
column_arg(PyObject *b, Py_ssize_t n, Py_ssize_t width, int c)
{
    if (!PyBytes_Check(b) || PyBytes_GET_SIZE(b) != n * width) {
        PyErr_Format(PyExc_ValueError, "column %d is not %zd bytes", c, n * width);
        return NULL;
    }
    return PyBytes_AS_STRING(b);
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

/* session_events(names, scopes, tracks, columns, profile_start, max_thread_id)
 * -> events: the events of a binary session, linked and checked. columns is
 * the ten column blocks in session_columns' order (native endian); the
 * indexes in them were checked against names, scopes, tracks and the event
 * count by the caller. Checks what validate_session checks of the fixed
 * fields and the links (times, flags, thread ids, track grouping and order,
 * nesting, cycles), with its messages; the rare fields are the caller's. */
static PyObject *
session_events(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (event_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "aprof: _events_setup() was not called");
        return NULL;
    }
    if (nargs != 6 || !PyList_Check(args[0]) || !PyList_Check(args[1]) || !PyList_Check(args[2]) ||
        !PyTuple_Check(args[3]) || PyTuple_GET_SIZE(args[3]) != N_COLUMNS) {
        PyErr_SetString(PyExc_TypeError, "session_events(names: list, scopes: list, tracks: list, columns: tuple, "
                                         "profile_start: int, max_thread_id: int)");
        return NULL;
    }
    PyObject *names = args[0], *scopes_list = args[1], *tracks = args[2], *columns = args[3];
    long long profile_start = PyLong_AsLongLong(args[4]), max_tid = PyLong_AsLongLong(args[5]);
    if ((profile_start == -1 || max_tid == -1) && PyErr_Occurred())
        return NULL;
    Py_ssize_t n = PyBytes_Check(PyTuple_GET_ITEM(columns, COL_KIND)) ? PyBytes_GET_SIZE(PyTuple_GET_ITEM(columns, COL_KIND)) : -1;
    const char *col[N_COLUMNS];
    for (int c = 0; c < N_COLUMNS; c++)
        if ((col[c] = column_arg(PyTuple_GET_ITEM(columns, c), n, column_widths[c], c)) == NULL)
            return NULL;
    PyObject *events = NULL;
    uint8_t *state = NULL;
    int32_t *chain = NULL;
    void *buf[N_COLUMNS] = {NULL};
    for (int c = 0; c < N_COLUMNS; c++)
        if ((buf[c] = PyMem_Malloc((size_t)(n > 0 ? n : 1) * (size_t)column_widths[c])) == NULL) {
            PyErr_NoMemory();
            goto fail;
        }
    for (int c = 0; c < N_COLUMNS; c++) /* COL_START first: COL_END needs it */
        decode_column((const uint8_t *)col[c], buf[c], buf[COL_START], n, c);
    const int64_t *start = buf[COL_START], *end = buf[COL_END], *end_lt = buf[COL_END_LT], *seq = buf[COL_SEQ],
                  *fwd = buf[COL_FWD];
    const int32_t *name = buf[COL_NAME], *track = buf[COL_TRACK], *parent = buf[COL_PARENT];
    const uint8_t *scope = buf[COL_SCOPE], *kind = buf[COL_KIND];
    Py_ssize_t n_names = PyList_GET_SIZE(names), n_scopes = PyList_GET_SIZE(scopes_list),
               n_tracks = PyList_GET_SIZE(tracks);
    events = PyList_New(n);
    state = PyMem_Calloc((size_t)(n_tracks > n ? n_tracks : n) + 1, 1);
    chain = PyMem_Malloc(((size_t)n + 1) * sizeof(int32_t));
    if (events == NULL || state == NULL || chain == NULL) {
        if (events != NULL)
            PyErr_NoMemory();
        goto fail;
    }
    /* Build and check each event's own fields, and the track grouping. */
    int32_t cur_track = -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        const char *table = NULL;
        long long bad = 0, lo = 0, top = 0;
        if (name[i] < 0 || name[i] >= n_names)
            table = "a name index", bad = name[i], top = n_names;
        else if (scope[i] >= n_scopes)
            table = "a scope index", bad = scope[i], top = n_scopes;
        else if (track[i] < 0 || track[i] >= n_tracks)
            table = "a track index", bad = track[i], top = n_tracks;
        else if (parent[i] < -1 || parent[i] >= n)
            table = "a parent index", bad = parent[i], lo = -1, top = n;
        if (table != NULL) {
            PyErr_Format(PyExc_ValueError, "event %zd has %s %lld outside %lld..%lld", i, table, bad, lo, top - 1);
            goto fail;
        }
        PyObject *nm = PyList_GET_ITEM(names, name[i]);
        if (start[i] > end[i]) {
            char what[120];
            PyOS_snprintf(what, sizeof what, "ends before it starts (end_ns %lld < start_ns %lld)",
                          (long long)end[i], (long long)start[i]);
            event_error(i, nm, what);
            goto fail;
        }
        if (kind[i] & ~(KIND_INSTANT | FLAG_UNFINISHED | FLAG_ASYNC)) {
            char what[80];
            PyOS_snprintf(what, sizeof what, "has kind flags %d aprof does not know", (int)kind[i]);
            event_error(i, nm, what);
            goto fail;
        }
        if ((kind[i] & KIND_INSTANT) && end[i] != start[i]) {
            char what[80];
            PyOS_snprintf(what, sizeof what, "is an instant with a duration (%lld ns)", (long long)(end[i] - start[i]));
            event_error(i, nm, what);
            goto fail;
        }
        if (fwd[i] < 0 || fwd[i] >= max_tid || end_lt[i] < -1 || end_lt[i] >= max_tid) {
            PyObject *label = event_label(i, nm);
            if (label != NULL) {
                PyObject *lt = end_lt[i] == -1 ? Py_NewRef(Py_None) : PyLong_FromLongLong(end_lt[i]);
                if (lt != NULL)
                    PyErr_Format(PyExc_ValueError,
                                 "%U names a thread outside 0..%lld (forward_thread_id %lld, end_thread_id %R)",
                                 label, max_tid - 1, (long long)fwd[i], lt);
                Py_XDECREF(lt);
                Py_DECREF(label);
            }
            goto fail;
        }
        if (start[i] < profile_start) {
            event_error(i, nm, "starts before the profile started (metadata start_ns)");
            goto fail;
        }
        if (track[i] != cur_track) {
            if (state[track[i]]) {
                PyObject *t = PyList_GET_ITEM(tracks, track[i]);
                PyObject *tid = PyObject_GetAttrString(t, "id");
                PyObject *label = event_label(i, nm);
                if (tid != NULL && label != NULL)
                    PyErr_Format(PyExc_ValueError,
                                 "%U is on track %R, whose events came earlier: the events are not grouped by track",
                                 label, tid);
                Py_XDECREF(tid);
                Py_XDECREF(label);
                goto fail;
            }
            if (cur_track >= 0)
                state[cur_track] = 1;
            cur_track = track[i];
        }
        else if (start[i] < start[i - 1]) {
            event_error(i, nm, "starts before the event listed before it on its track");
            goto fail;
        }
        PyObject *rec = PyList_New(R_SIZE);
        if (rec == NULL)
            goto fail;
        for (Py_ssize_t s = 0; s < R_SIZE; s++)
            PyList_SET_ITEM(rec, s, Py_NewRef(Py_None));
        set_slot(rec, R_NAME, Py_NewRef(nm));
        set_slot(rec, R_SCOPE, Py_NewRef(PyList_GET_ITEM(scopes_list, scope[i])));
        PyObject *v;
#define SET_INT(slot, x)                       \
    if ((v = PyLong_FromLongLong(x)) == NULL) { \
        Py_DECREF(rec);                        \
        goto fail;                             \
    }                                          \
    set_slot(rec, slot, v)
        SET_INT(R_START, start[i]);
        SET_INT(R_END, end[i]);
        if (end_lt[i] != -1) {
            SET_INT(R_END_LT, end_lt[i]);
        }
        SET_INT(R_SEQ, seq[i]);
        SET_INT(R_FWD, fwd[i]);
        SET_INT(R_KIND, kind[i]);
#undef SET_INT
        /* Strings, ints, None and the scope: no cycle can pass through it
         * (the rare fields the caller adds are plain JSON values). */
        PyObject_GC_UnTrack(rec);
        EventCore *ev = (EventCore *)event_type->tp_alloc(event_type, 0);
        if (ev == NULL) {
            Py_DECREF(rec);
            goto fail;
        }
        ev->r = rec;
        ev->t = Py_NewRef(PyList_GET_ITEM(tracks, track[i]));
        ev->children = Py_NewRef(no_children);
        ev->parent = Py_NewRef(Py_None);
        PyList_SET_ITEM(events, i, (PyObject *)ev);
    }
    /* Link parents and children: an async range, or one on another track,
     * has a parent but is not its child; a child lies within its parent. */
    for (Py_ssize_t i = 0; i < n; i++) {
        int32_t p = parent[i];
        if (p < 0)
            continue;
        EventCore *ev = (EventCore *)PyList_GET_ITEM(events, i), *pe = (EventCore *)PyList_GET_ITEM(events, p);
        Py_SETREF(ev->parent, Py_NewRef(pe));
        if (!(kind[i] & FLAG_ASYNC) && track[p] == track[i]) {
            if (start[i] < start[p] || end[i] > end[p]) {
                PyObject *cl = event_label(i, PyList_GET_ITEM(names, name[i]));
                PyObject *pl = event_label(p, PyList_GET_ITEM(names, name[p]));
                if (cl != NULL && pl != NULL)
                    PyErr_Format(PyExc_ValueError, "%U is nested in %U but outside its time", cl, pl);
                Py_XDECREF(cl);
                Py_XDECREF(pl);
                goto fail;
            }
            if (add_child(pe, ev) < 0)
                goto fail;
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
                PyObject *label = event_label(cur, PyList_GET_ITEM(names, name[cur]));
                if (label != NULL)
                    PyErr_Format(PyExc_ValueError,
                                 parent[cur] == cur ? "%U is its own parent"
                                                    : "%U is its own ancestor (a cycle of parent links)",
                                 label);
                Py_XDECREF(label);
                goto fail;
            }
            state[cur] = 1;
            chain[len++] = cur;
            cur = parent[cur];
        }
        for (Py_ssize_t k = 0; k < len; k++)
            state[chain[k]] = 2;
    }
    PyMem_Free(state);
    PyMem_Free(chain);
    for (int c = 0; c < N_COLUMNS; c++)
        PyMem_Free(buf[c]);
    return events;
fail:
    PyMem_Free(state);
    PyMem_Free(chain);
    for (int c = 0; c < N_COLUMNS; c++)
        PyMem_Free(buf[c]);
    Py_XDECREF(events); /* unfilled slots are NULL: list_dealloc skips them */
    return NULL;
}

/* ------------------------------------------------------------------------ */
/* name_totals: key_averages by name, for plain ranges                       */
/* ------------------------------------------------------------------------ */

typedef struct {
    int64_t first, count, total, self, min, max;
} NameRow;

/* The duration of an event's record; -1 with an exception set if its
 * times are not ints. */
static int
record_duration(PyObject *rec, int64_t *out)
{
    int64_t s, e;
    if (slot_i64(rec, R_START, -1, "start_ns", &s) < 0 || slot_i64(rec, R_END, -1, "end_ns", &e) < 0)
        return -1;
    if (__builtin_sub_overflow(e, s, out)) {
        PyErr_SetString(PyExc_OverflowError, "a duration does not fit 64 bits");
        return -1;
    }
    return 0;
}

/* name_totals(events, apart, steps_of) -> (names, first, count, total, self,
 * min, max, others): _analysis._by_name's sums for the plain ranges (not
 * instants; scope not in `apart`, no extra, on a track whose steps_of(track)
 * is None), one row per name in order of first use (first: the index of
 * its first event); others the indexes of the other ranges, which the
 * caller adds one by one. OverflowError if a sum passes 64 bits. */
static PyObject *
name_totals(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyList_Check(args[0]) || !PyTuple_Check(args[1]) || !PyCallable_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "name_totals(events: list, apart: tuple, steps_of: callable)");
        return NULL;
    }
    PyObject *events = args[0], *apart = args[1], *steps_of = args[2];
    PyObject *ids = PyDict_New(), *names = PyList_New(0), *others = PyList_New(0), *result = NULL;
    NameRow *rows = NULL;
    Py_ssize_t n_rows = 0, cap = 0;
    PyObject *last_track = NULL;
    int last_plain_track = 0;
    if (ids == NULL || names == NULL || others == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(events); i++) {
        PyObject *obj = PyList_GET_ITEM(events, i);
        if (!PyObject_TypeCheck(obj, &EventCoreType)) {
            PyErr_Format(PyExc_TypeError, "event %zd is a %.100s, not a FunctionEvent", i, Py_TYPE(obj)->tp_name);
            goto done;
        }
        EventCore *ev = (EventCore *)obj;
        PyObject *rec = ev->r;
        if (rec == NULL || !PyList_CheckExact(rec) || PyList_GET_SIZE(rec) != R_SIZE) {
            PyErr_Format(PyExc_ValueError, "event %zd has a record of the wrong shape", i);
            goto done;
        }
        int64_t kind;
        if (slot_i64(rec, R_KIND, i, "kind", &kind) < 0)
            goto done;
        if (kind & KIND_INSTANT)
            continue;
        if (ev->t != last_track) {
            PyObject *steps = PyObject_CallOneArg(steps_of, ev->t);
            if (steps == NULL)
                goto done;
            last_plain_track = steps == Py_None;
            Py_DECREF(steps);
            last_track = ev->t;
        }
        int plain = last_plain_track && PyList_GET_ITEM(rec, R_EXTRA) == Py_None;
        for (Py_ssize_t k = 0; plain && k < PyTuple_GET_SIZE(apart); k++)
            if (PyList_GET_ITEM(rec, R_SCOPE) == PyTuple_GET_ITEM(apart, k))
                plain = 0;
        if (!plain) {
            PyObject *ix = PyLong_FromSsize_t(i);
            if (ix == NULL || PyList_Append(others, ix) < 0) {
                Py_XDECREF(ix);
                goto done;
            }
            Py_DECREF(ix);
            continue;
        }
        PyObject *name = PyList_GET_ITEM(rec, R_NAME);
        PyObject *id = PyDict_GetItemWithError(ids, name);
        Py_ssize_t row;
        if (id != NULL)
            row = PyLong_AsSsize_t(id);
        else {
            if (PyErr_Occurred())
                goto done;
            if (n_rows == cap) {
                Py_ssize_t ncap = cap ? cap * 2 : 64;
                NameRow *nr = PyMem_Realloc(rows, (size_t)ncap * sizeof(NameRow));
                if (nr == NULL) {
                    PyErr_NoMemory();
                    goto done;
                }
                rows = nr;
                cap = ncap;
            }
            row = n_rows;
            PyObject *rid = PyLong_FromSsize_t(row);
            if (rid == NULL || PyDict_SetItem(ids, name, rid) < 0 || PyList_Append(names, name) < 0) {
                Py_XDECREF(rid);
                goto done;
            }
            Py_DECREF(rid);
            rows[row] = (NameRow){.first = i, .count = 0, .total = 0, .self = 0, .min = 0, .max = 0};
            n_rows++;
        }
        int64_t d, own;
        if (record_duration(rec, &d) < 0)
            goto done;
        own = d;
        if (ev->children != NULL && PyList_Check(ev->children)) {
            for (Py_ssize_t c = 0; c < PyList_GET_SIZE(ev->children); c++) {
                PyObject *ch = PyList_GET_ITEM(ev->children, c);
                int64_t cd;
                if (!PyObject_TypeCheck(ch, &EventCoreType) || ((EventCore *)ch)->r == NULL) {
                    PyErr_Format(PyExc_TypeError, "event %zd has a child that is not a FunctionEvent", i);
                    goto done;
                }
                if (record_duration(((EventCore *)ch)->r, &cd) < 0)
                    goto done;
                if (__builtin_sub_overflow(own, cd, &own))
                    goto overflow;
            }
        }
        NameRow *r = &rows[row];
        if (r->count == 0 || d < r->min)
            r->min = d;
        if (d > r->max)
            r->max = d;
        r->count++;
        if (__builtin_add_overflow(r->total, d, &r->total) || __builtin_add_overflow(r->self, own, &r->self))
            goto overflow;
    }
    PyObject *cols[6];
    for (int c = 0; c < 6; c++) {
        if ((cols[c] = PyList_New(n_rows)) == NULL) {
            for (int k = 0; k < c; k++)
                Py_DECREF(cols[k]);
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
    result = Py_BuildValue("(ONNNNNNO)", names, cols[0], cols[1], cols[2], cols[3], cols[4], cols[5], others);
    goto done;
overflow:
    PyErr_SetString(PyExc_OverflowError, "a sum of durations does not fit 64 bits");
done:
    Py_XDECREF(ids);
    Py_XDECREF(names);
    Py_XDECREF(others);
    PyMem_Free(rows);
    return result;
}

/* _events_setup(FunctionEvent, no_children, scopes, start_key, layout):
 * layout is (R_NAME, ..., R_EXTRA, KIND_INSTANT, FLAG_UNFINISHED,
 * FLAG_ASYNC, ASYNC_SAME_THREAD) as Python defines them. */
static PyObject *
events_setup(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5 || !PyType_Check(args[0]) || !PyList_CheckExact(args[1]) || !PyDict_Check(args[2]) ||
        !PyCallable_Check(args[3]) || !PyTuple_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError, "_events_setup(FunctionEvent, no_children, scopes, start_key, layout)");
        return NULL;
    }
    PyTypeObject *tp = (PyTypeObject *)args[0];
    if (!PyType_IsSubtype(tp, &EventCoreType) || tp->tp_basicsize != EventCoreType.tp_basicsize) {
        PyErr_Format(PyExc_TypeError, "aprof: %s must subclass EventCore with __slots__ = ()", tp->tp_name);
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
    Py_XSETREF(event_type, (PyTypeObject *)Py_NewRef(tp));
    Py_XSETREF(no_children, Py_NewRef(args[1]));
    Py_XSETREF(scopes, Py_NewRef(args[2]));
    Py_XSETREF(start_key, Py_NewRef(args[3]));
    Py_RETURN_NONE;
}

static PyMethodDef event_functions[] = {
    {"_events_setup", (PyCFunction)(void (*)(void))events_setup, METH_FASTCALL,
     "Give consolidation FunctionEvent, _NO_CHILDREN, the scopes, the sort key and the record layout."},
    {"records_of", (PyCFunction)(void (*)(void))records_of, METH_FASTCALL,
     "Pair one logical thread's start and end tuples into consolidated records."},
    {"sort_by_start", (PyCFunction)sort_by_start, METH_O, "Sort records by start time unless already in order."},
    {"nest", (PyCFunction)(void (*)(void))nest, METH_FASTCALL,
     "Build one track's events from its records, nested, appending them to events (and the top-level "
     "ones with a forward thread to linked)."},
    {"chrome_plain", (PyCFunction)(void (*)(void))chrome_plain, METH_FASTCALL,
     "The Chrome trace lines of a run of plain ranges, and the index after it."},
    {"session_columns", (PyCFunction)(void (*)(void))session_columns, METH_FASTCALL,
     "A session's column blocks, names and rare-event indexes (the binary format's writer)."},
    {"name_totals", (PyCFunction)(void (*)(void))name_totals, METH_FASTCALL,
     "key_averages by name: the sums of the plain ranges, and the indexes of the others."},
    {"session_events", (PyCFunction)(void (*)(void))session_events, METH_FASTCALL,
     "The events of a binary session's columns, linked and checked (the binary format's reader)."},
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
    if (PyType_Ready(&EventCoreType) < 0)
        return -1;
    if (PyModule_AddObjectRef(module, "EventCore", (PyObject *)&EventCoreType) < 0)
        return -1;
    return PyModule_AddFunctions(module, event_functions);
}
