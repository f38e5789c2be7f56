/* The streaming relay's hot path in C: what a pushed stream does with each read of whole token chunks.
 *
 * `TokenSink.data(read)` applies `gateway.relay.sse.tokens_by_bytes` to every SSE event of one upstream
 * read. When all of them are plain token chunks and the read ends where an event ends (nearly every
 * read of an SGLang stream), it does here what the Python relay would: `EventTriage.tokens` (the
 * stream's first/last token times, its token count and the first/gap/token callbacks) and
 * `BodyWriter.write` (one chunk of the chunked body to the client's transport), then pauses upstream
 * reading or re-arms the idle watch. Any other read goes to the Python relay (`slow`), which keeps
 * `whole` up to date. `GapCounts` is `gateway.relay.gaps.GapBuffer`'s per-gap count, so the gap
 * callback is a C call too.
 *
 * Measured (docs/benchmarks/): the relay's own work per chunk 2.29 -> 0.94 us (relay-cost.md,
 * Debian's python3.11), the gateway's whole CPU per relayed chunk 29.3 -> 27.0 us end to end
 * (gateway-overhead.md, six rounds alternating with the code before). tests/gateway/test_sse_native.py
 * holds the C rule to the Python one; tests/gateway/test_relay.py runs every relay test with and
 * without this module.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>
#include <time.h>
#include "structmember.h"

#define LIT(s) s, (sizeof(s) - 1)

static int
ends_with(const char *e, Py_ssize_t n, const char *tail, Py_ssize_t m)
{
    return n >= m && memcmp(e + n - m, tail, m) == 0;
}

static const char *
find(const char *e, Py_ssize_t n, const char *needle, Py_ssize_t m)
{
    return memmem(e, (size_t)n, needle, (size_t)m);
}

/* A key followed by its value's first byte, which must not be `closing` (an empty value). */
static int
non_empty(const char *e, Py_ssize_t n, const char *key, Py_ssize_t m, char closing)
{
    const char *at = find(e, n, key, m);
    return at != NULL && at + m < e + n && at[m] != closing;
}

/* tokens_by_bytes, for the event e[0:n] ("data: {...}" and its blank line). */
static int
surely_tokens(const char *e, Py_ssize_t n)
{
    if (n < 7 || memcmp(e, "data: {", 7) != 0 || find(e, n, LIT("\"error\"")) != NULL) {
        return 0;
    }
    if (!ends_with(e, n, LIT(",\"usage\":null}\n\n"))
        && (!ends_with(e, n, LIT("}\n\n")) || find(e, n, LIT("\"usage\":")) != NULL)) {
        return 0;
    }
    return non_empty(e, n, LIT("\"content\":\""), '"')
        || non_empty(e, n, LIT("\"reasoning_content\":\""), '"')
        || non_empty(e, n, LIT("\"text\":\""), '"')
        || non_empty(e, n, LIT("\"tool_calls\":["), ']');
}

/* How many events `data` holds when every one is a plain token chunk and `data` ends where an event
 * ends; 0 otherwise. */
static long
count_token_events(const char *bytes, Py_ssize_t size)
{
    Py_ssize_t start = 0;
    long events = 0;
    while (start < size) {
        const char *separator = find(bytes + start, size - start, LIT("\n\n"));
        if (separator == NULL) {
            return 0;
        }
        Py_ssize_t end = separator - bytes + 2;
        if (!surely_tokens(bytes + start, end - start)) {
            return 0;
        }
        events++;
        start = end;
    }
    return events;
}

/* ---- TokenSink: a pushed stream's reads of whole token chunks, relayed without Python frames ---- */

static PyObject *s_first, *s_last, *s_chunks, *s_write, *s_is_closing, *s_write_paused, *s_reading_since;

typedef struct {
    PyObject_HEAD
    PyObject *slow;       /* data -> None: the Python relay, for every other read */
    PyObject *fail;       /* exception -> None: an error while relaying, raised in the request's task */
    PyObject *pause;      /* () -> None: the client's buffer is full */
    PyObject *result;     /* the StreamResult: first_token_at, last_token_at, token_chunks */
    PyObject *on_first;   /* now -> None, at the stream's first token */
    PyObject *on_gap;     /* seconds -> None, at every later token */
    PyObject *on_token;   /* now -> None, at every token */
    PyObject *transport;  /* the client's: write(), is_closing() */
    PyObject *flow;       /* the client's flow control: write_paused */
    PyObject *watch;      /* the IdleWatch: reading_since */
    PyObject *loop_time;  /* () -> float: the loop's clock */
    PyObject *keep;       /* list each read of token chunks is appended to (a movable stream's text), or None */
    int whole;            /* no event is half read, and the stream goes on: a read may take the fast path */
} TokenSink;

#define SINK_REFS(X) X(slow) X(fail) X(pause) X(result) X(on_first) X(on_gap) X(on_token) \
    X(transport) X(flow) X(watch) X(loop_time) X(keep)

static int
sink_traverse(TokenSink *self, visitproc visit, void *arg)
{
#define VISIT(name) Py_VISIT(self->name);
    SINK_REFS(VISIT)
#undef VISIT
    return 0;
}

static int
sink_clear(TokenSink *self)
{
#define CLEAR(name) Py_CLEAR(self->name);
    SINK_REFS(CLEAR)
#undef CLEAR
    self->whole = 0;
    return 0;
}

static void
sink_dealloc(TokenSink *self)
{
    PyObject_GC_UnTrack(self);
    sink_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int
sink_init(TokenSink *self, PyObject *args, PyObject *kwargs)
{
    static char *names[] = {"slow", "fail", "pause", "result", "on_first", "on_gap", "on_token",
                            "transport", "flow", "watch", "loop_time", "keep", NULL};
    /* Every argument is keyword-only and all but `keep` are required: the format can only say that
       all are optional, so the required ones are checked after parsing. */
    PyObject *refs[12] = {NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, Py_None};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|$OOOOOOOOOOOO:TokenSink", names, &refs[0], &refs[1],
                                     &refs[2], &refs[3], &refs[4], &refs[5], &refs[6], &refs[7],
                                     &refs[8], &refs[9], &refs[10], &refs[11])) {
        return -1;
    }
    for (int k = 0; k < 11; k++) {
        if (refs[k] == NULL) {
            PyErr_Format(PyExc_TypeError, "TokenSink() missing required keyword argument '%s'", names[k]);
            return -1;
        }
    }
    if (refs[11] != Py_None && !PyList_Check(refs[11])) {
        PyErr_SetString(PyExc_TypeError, "keep must be a list or None");
        return -1;
    }
    sink_clear(self);
    int i = 0;
#define SET(name) self->name = Py_NewRef(refs[i++]);
    SINK_REFS(SET)
#undef SET
    self->whole = 1;
    return 0;
}

static double
monotonic(void)
{
    /* time.monotonic()'s clock and rounding, so times from here and from Python compare. */
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)((int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec) / 1e9;
}

static int
call_float(PyObject *callable, double value)
{
    PyObject *arg = PyFloat_FromDouble(value);
    if (arg == NULL) {
        return -1;
    }
    PyObject *out = PyObject_CallOneArg(callable, arg);
    Py_DECREF(arg);
    if (out == NULL) {
        return -1;
    }
    Py_DECREF(out);
    return 0;
}

/* EventTriage.tokens(events), on the StreamResult's own fields. */
static int
tally(TokenSink *self, long events)
{
    double now = monotonic();
    PyObject *stamp = PyFloat_FromDouble(now);
    if (stamp == NULL) {
        return -1;
    }
    for (long i = 0; i < events && self->result != NULL; i++) {  /* NULL: a callback closed the sink */
        PyObject *first = PyObject_GetAttr(self->result, s_first);
        if (first == NULL) {
            goto error;
        }
        int is_first = first == Py_None;
        Py_DECREF(first);
        if (is_first) {
            if (PyObject_SetAttr(self->result, s_first, stamp) < 0) {
                goto error;
            }
            PyObject *out = PyObject_CallOneArg(self->on_first, stamp);
            if (out == NULL) {
                goto error;
            }
            Py_DECREF(out);
        }
        else {
            PyObject *last = PyObject_GetAttr(self->result, s_last);
            if (last == NULL) {
                goto error;
            }
            double then = PyFloat_AsDouble(last);
            Py_DECREF(last);
            if ((then == -1.0 && PyErr_Occurred()) || call_float(self->on_gap, now - then) < 0) {
                goto error;
            }
        }
        PyObject *out = PyObject_CallOneArg(self->on_token, stamp);
        if (out == NULL) {
            goto error;
        }
        Py_DECREF(out);
        if (PyObject_SetAttr(self->result, s_last, stamp) < 0) {
            goto error;
        }
    }
    Py_DECREF(stamp);
    if (self->result == NULL) {
        return 0;
    }
    PyObject *chunks = PyObject_GetAttr(self->result, s_chunks);
    if (chunks == NULL) {
        return -1;
    }
    PyObject *more = PyLong_FromLong(events);
    PyObject *sum = more == NULL ? NULL : PyNumber_Add(chunks, more);
    Py_DECREF(chunks);
    Py_XDECREF(more);
    if (sum == NULL) {
        return -1;
    }
    int set = PyObject_SetAttr(self->result, s_chunks, sum);
    Py_DECREF(sum);
    return set;
error:
    Py_DECREF(stamp);
    return -1;
}

/* BodyWriter.write: one chunk of the chunked body, unless the client has left. 1: its buffer is full. */
static int
write_chunk(TokenSink *self, PyObject *data)
{
    PyObject *closing = PyObject_CallMethodNoArgs(self->transport, s_is_closing);
    if (closing == NULL) {
        return -1;
    }
    int gone = PyObject_IsTrue(closing);
    Py_DECREF(closing);
    if (gone < 0) {
        return -1;
    }
    if (!gone) {
        Py_ssize_t size = PyBytes_GET_SIZE(data);
        char head[24];
        int head_size = snprintf(head, sizeof(head), "%zx\r\n", size);
        PyObject *chunk = PyBytes_FromStringAndSize(NULL, head_size + size + 2);
        if (chunk == NULL) {
            return -1;
        }
        char *out = PyBytes_AS_STRING(chunk);
        memcpy(out, head, head_size);
        memcpy(out + head_size, PyBytes_AS_STRING(data), size);
        memcpy(out + head_size + size, "\r\n", 2);
        PyObject *written = PyObject_CallMethodOneArg(self->transport, s_write, chunk);
        Py_DECREF(chunk);
        if (written == NULL) {
            return -1;
        }
        Py_DECREF(written);
    }
    PyObject *paused = PyObject_GetAttr(self->flow, s_write_paused);
    if (paused == NULL) {
        return -1;
    }
    int full = PyObject_IsTrue(paused);
    Py_DECREF(paused);
    return full;
}

/* The error being raised, taken (normalised, with its traceback). */
static PyObject *
take_exception(void)
{
#if PY_VERSION_HEX >= 0x030C0000
    return PyErr_GetRaisedException();
#else
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyErr_NormalizeException(&type, &value, &traceback);
    if (traceback != NULL) {
        PyException_SetTraceback(value, traceback);
    }
    Py_XDECREF(type);
    Py_XDECREF(traceback);
    return value;
#endif
}

/* After a tally and a write: pause upstream reading, or note that the next read has begun. */
static PyObject *
after_write(TokenSink *self, int full)
{
    if (self->pause == NULL) {
        Py_RETURN_NONE;  /* closed meanwhile */
    }
    if (full) {
        return PyObject_CallNoArgs(self->pause);
    }
    PyObject *now = PyObject_CallNoArgs(self->loop_time);
    if (now == NULL) {
        return NULL;
    }
    int set = PyObject_SetAttr(self->watch, s_reading_since, now);
    Py_DECREF(now);
    if (set < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
sink_data(TokenSink *self, PyObject *data)
{
    long events = 0;
    if (self->whole && PyBytes_Check(data)) {
        events = count_token_events(PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data));
    }
    if (events == 0) {
        if (self->slow == NULL) {
            Py_RETURN_NONE;  /* closed */
        }
        return PyObject_CallOneArg(self->slow, data);
    }
    Py_INCREF(self);  /* a callback may close the sink */
    PyObject *out = NULL;
    int full = 0;
    int kept = self->keep == NULL || self->keep == Py_None ? 0 : PyList_Append(self->keep, data);
    if (kept == 0 && tally(self, events) == 0 && (self->transport == NULL || (full = write_chunk(self, data)) >= 0)) {
        out = self->transport == NULL ? Py_NewRef(Py_None) : after_write(self, full);
    }
    /* As the Python relay: an Exception goes to the request's task, anything else propagates. */
    if (out == NULL && self->fail != NULL && PyErr_ExceptionMatches(PyExc_Exception)) {
        PyObject *exc = take_exception();
        out = PyObject_CallOneArg(self->fail, exc);
        Py_DECREF(exc);
    }
    Py_DECREF(self);
    return out;
}

static PyObject *
sink_close(TokenSink *self, PyObject *Py_UNUSED(ignored))
{
    sink_clear(self);
    Py_RETURN_NONE;
}

static PyMethodDef sink_methods[] = {
    {"data", (PyCFunction)sink_data, METH_O,
     "data(data: bytes) -> None\n--\n\n"
     "One read of the body: whole token chunks are counted and written here, anything else goes to `slow`."},
    {"close", (PyCFunction)sink_close, METH_NOARGS,
     "close() -> None\n--\n\nDrop every reference (the relay's end); later reads do nothing."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef sink_members[] = {
    {"whole", T_BOOL, offsetof(TokenSink, whole), 0,
     "No event is half read and the stream goes on: set by the Python relay after each read it takes."},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject TokenSinkType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "gateway.relay._sse.TokenSink",
    .tp_doc = "A pushed stream's sink: reads of whole plain token chunks are tallied (as EventTriage.tokens)\n"
              "and written (as BodyWriter.write) here; every other read goes to the Python relay.",
    .tp_basicsize = sizeof(TokenSink),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)sink_init,
    .tp_dealloc = (destructor)sink_dealloc,
    .tp_traverse = (traverseproc)sink_traverse,
    .tp_clear = (inquiry)sink_clear,
    .tp_methods = sink_methods,
    .tp_members = sink_members,
};

/* ---- GapCounts: one stream's inter-token gaps by histogram bucket (gateway.relay.gaps.GapBuffer) ---- */

typedef struct {
    PyObject_HEAD
    Py_ssize_t size;
    double *bounds;   /* the histogram's upper bounds, ascending, the last +Inf */
    long *counts;
    double sum;
} GapCounts;

static void
gaps_dealloc(GapCounts *self)
{
    PyMem_Free(self->bounds);
    PyMem_Free(self->counts);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int
gaps_init(GapCounts *self, PyObject *args, PyObject *kwargs)
{
    static char *names[] = {"bounds", NULL};
    PyObject *bounds;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O:GapCounts", names, &bounds)) {
        return -1;
    }
    PyObject *seq = PySequence_Fast(bounds, "bounds must be a sequence of floats");
    if (seq == NULL) {
        return -1;
    }
    Py_ssize_t size = PySequence_Fast_GET_SIZE(seq);
    PyMem_Free(self->bounds);
    PyMem_Free(self->counts);
    self->bounds = PyMem_New(double, size > 0 ? size : 1);
    self->counts = PyMem_New(long, size > 0 ? size : 1);
    self->size = 0;
    self->sum = 0.0;
    if (self->bounds == NULL || self->counts == NULL) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < size; i++) {
        self->bounds[i] = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(seq, i));
        self->counts[i] = 0;
        if (self->bounds[i] == -1.0 && PyErr_Occurred()) {
            Py_DECREF(seq);
            return -1;
        }
    }
    Py_DECREF(seq);
    self->size = size;
    return 0;
}

static PyObject *
gaps_observe(GapCounts *self, PyObject *arg)
{
    double seconds = PyFloat_AsDouble(arg);
    if (seconds == -1.0 && PyErr_Occurred()) {
        return NULL;
    }
    /* bisect.bisect_left: the first bucket whose bound is at least `seconds` (NaN: the first). */
    Py_ssize_t lo = 0, hi = self->size;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        if (self->bounds[mid] < seconds) {
            lo = mid + 1;
        }
        else {
            hi = mid;
        }
    }
    if (lo == self->size) {
        PyErr_SetString(PyExc_IndexError, "a gap above every bound (the last bound must be +Inf)");
        return NULL;
    }
    self->counts[lo]++;
    self->sum += seconds;
    Py_RETURN_NONE;
}

static PyObject *
gaps_take(GapCounts *self, PyObject *Py_UNUSED(ignored))
{
    PyObject *counts = PyList_New(self->size);
    if (counts == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < self->size; i++) {
        PyObject *count = PyLong_FromLong(self->counts[i]);
        if (count == NULL) {
            Py_DECREF(counts);
            return NULL;
        }
        PyList_SET_ITEM(counts, i, count);
    }
    PyObject *out = Py_BuildValue("(Nd)", counts, self->sum);
    if (out != NULL) {
        memset(self->counts, 0, sizeof(long) * (size_t)self->size);
        self->sum = 0.0;
    }
    return out;
}

static PyMethodDef gaps_methods[] = {
    {"observe", (PyCFunction)gaps_observe, METH_O,
     "observe(seconds: float) -> None\n--\n\nCount one gap in the first bucket whose bound is at least `seconds`."},
    {"take", (PyCFunction)gaps_take, METH_NOARGS,
     "take() -> tuple[list[int], float]\n--\n\nThe counts per bucket and the sum so far; starts again from zero."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject GapCountsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "gateway.relay._sse.GapCounts",
    .tp_doc = "GapCounts(bounds)\n--\n\nInter-token gaps counted by histogram bucket: `observe` is a C call,\n"
              "no Python frame per relayed chunk (gateway.relay.gaps.GapBuffer).",
    .tp_basicsize = sizeof(GapCounts),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)gaps_init,
    .tp_dealloc = (destructor)gaps_dealloc,
    .tp_methods = gaps_methods,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "gateway.relay._sse",
    .m_doc = "The streaming relay's hot path in C (see gateway/relay/sse.py).",
    .m_size = -1,
};

PyMODINIT_FUNC
PyInit__sse(void)
{
    if (PyType_Ready(&TokenSinkType) < 0 || PyType_Ready(&GapCountsType) < 0) {
        return NULL;
    }
#define INTERN(var, text) if ((var = PyUnicode_InternFromString(text)) == NULL) return NULL;
    INTERN(s_first, "first_token_at")
    INTERN(s_last, "last_token_at")
    INTERN(s_chunks, "token_chunks")
    INTERN(s_write, "write")
    INTERN(s_is_closing, "is_closing")
    INTERN(s_write_paused, "write_paused")
    INTERN(s_reading_since, "reading_since")
#undef INTERN
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) {
        return NULL;
    }
    if (PyModule_AddObjectRef(m, "TokenSink", (PyObject *)&TokenSinkType) < 0
        || PyModule_AddObjectRef(m, "GapCounts", (PyObject *)&GapCountsType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
