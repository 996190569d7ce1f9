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
