/*
 * receivewal.replication._recv: the compiled receive loop of the COPY stream (optional).
 *
 * The pure-Python path (ReplicationConnection.read_copy, one CopyData payload per call) is the
 * reference; this module takes every plain XLogData message libpq already holds (or can read
 * from the socket without waiting) in one call:
 *
 *   bind(libpq_path)
 *       resolves PQgetCopyData, PQconsumeInput and PQfreemem in the libpq that is ALREADY
 *       loaded from libpq_path (dlopen with RTLD_NOLOAD): the one psycopg uses, so that the
 *       PGconn* psycopg hands out is read by the same code that made it (the caller,
 *       replication/nativerecv.py, also has glibc keep freed buffers: receivewal/allocator.py).
 *   read(pgconn_ptr, max_bytes, max_messages, until[, scattered])
 *       -> (wal_start, wal_end, payloads, wire, other, starts)
 *       reads plain XLogData messages whose WAL follows on from the previous one's (with
 *       scattered true: any walStart, each listed in starts, a logical stream's; otherwise
 *       starts is None) until
 *       max_bytes of WAL or max_messages are taken, a message reached the LSN until (as
 *       Python's path, which stops at --endpos after the message that reached it), or
 *       nothing more has arrived. payloads is
 *       a list of memoryviews of the messages' WAL bytes, left in the buffers libpq allocated
 *       (freed with PQfreemem once the last view is gone): nothing is copied here; with
 *       scattered, a list of bytes (a logical stream's messages are small and read whole: a
 *       copy costs less than a view and its owner, and libpq's buffer is freed at once).
 *       wal_end is the last message's walEnd, wire the messages' CopyData bytes. The
 *       message that ends a batch otherwise is handed back as other: its CopyData payload as
 *       bytes (a keepalive, a pg_streampack-compressed or malformed XLogData, one that does
 *       not follow on, anything unknown; Python parses and refuses as it does on its own
 *       path), -1 for the end of the server's COPY stream, -2 when libpq reports an error
 *       (Python reads libpq's message); None when the batch ended for another reason.
 *
 * The XLogData layout is the replication protocol's: 'w', walStart u64, walEnd u64, sendTime
 * i64 (big-endian; pg_streampack sets sendTime's top bit on the frames it compressed), WAL.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <stdint.h>
#include <string.h>

#define XLOGDATA_HEADER 25
#define FLAG_OFFSET 17
#define FLAG_BIT 0x80

/* libpq-fe.h's prototypes, declared here so that no header is needed at build time */
typedef int (*get_copy_data_fn)(void *conn, char **buffer, int async);
typedef int (*consume_input_fn)(void *conn);
typedef void (*freemem_fn)(void *ptr);

static get_copy_data_fn pq_get_copy_data;
static consume_input_fn pq_consume_input;
static freemem_fn pq_freemem;

/* -- a buffer libpq allocated, exported read-only through the buffer protocol ------------- */
typedef struct {
    PyObject_HEAD
    char *base;       /* what PQgetCopyData returned, freed with PQfreemem */
    Py_ssize_t offset;
    Py_ssize_t length;
} PQBufferObject;

static void
pqbuffer_dealloc(PQBufferObject *self)
{
    if (self->base != NULL)
        pq_freemem(self->base);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int
pqbuffer_getbuffer(PQBufferObject *self, Py_buffer *view, int flags)
{
    return PyBuffer_FillInfo(view, (PyObject *)self, self->base + self->offset, self->length,
                             1, flags);
}

static PyBufferProcs pqbuffer_as_buffer = {(getbufferproc)pqbuffer_getbuffer, NULL};

static PyTypeObject PQBufferType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "receivewal.replication._recv.PQBuffer",
    .tp_basicsize = sizeof(PQBufferObject),
    .tp_dealloc = (destructor)pqbuffer_dealloc,
    .tp_as_buffer = &pqbuffer_as_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "WAL bytes in a buffer libpq allocated (freed with PQfreemem).",
};

/* A memoryview of buf[offset:offset+length]; takes buf over (freed on failure too). */
static PyObject *
payload_view(char *buf, Py_ssize_t offset, Py_ssize_t length)
{
    PQBufferObject *owner = PyObject_New(PQBufferObject, &PQBufferType);
    if (owner == NULL) {
        pq_freemem(buf);
        return NULL;
    }
    owner->base = buf;
    owner->offset = offset;
    owner->length = length;
    PyObject *view = PyMemoryView_FromObject((PyObject *)owner);
    Py_DECREF(owner);
    return view;
}

static uint64_t
be64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = (v << 8) | p[i];
    return v;
}

/* One PQgetCopyData, reading the socket once more (without waiting) when libpq holds no
 * whole message yet. *consumed says whether the socket was read since the last message. */
static int
next_message(void *conn, char **buf, int *consumed)
{
    int n;
    Py_BEGIN_ALLOW_THREADS
    n = pq_get_copy_data(conn, buf, 1);
    if (n == 0 && !*consumed) {
        *consumed = 1;
        if (pq_consume_input(conn) == 0)
            n = -2;
        else
            n = pq_get_copy_data(conn, buf, 1);
    }
    Py_END_ALLOW_THREADS
    if (n > 0)
        *consumed = 0;
    return n;
}

static PyObject *
recv_read(PyObject *module, PyObject *args)
{
    unsigned long long ptr, until;
    Py_ssize_t max_bytes, max_messages;
    int scattered = 0;
    if (pq_get_copy_data == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_recv.bind() was not called");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "KnnK|p", &ptr, &max_bytes, &max_messages, &until, &scattered))
        return NULL;
    void *conn = (void *)(uintptr_t)ptr;
    PyObject *payloads = PyList_New(0);
    if (payloads == NULL)
        return NULL;
    PyObject *starts = scattered ? PyList_New(0) : Py_NewRef(Py_None);
    if (starts == NULL) {
        Py_DECREF(payloads);
        return NULL;
    }
    PyObject *other = NULL;
    uint64_t wal_start = 0, wal_end = 0, next_lsn = 0;
    Py_ssize_t wal_bytes = 0, wire = 0, count = 0;
    int consumed = 0;
    while (wal_bytes < max_bytes && count < max_messages && (count == 0 || next_lsn < until)) {
        char *buf = NULL;
        int n = next_message(conn, &buf, &consumed);
        if (n == 0)
            break;
        if (n < 0) {
            if (buf != NULL)
                pq_freemem(buf);
            other = PyLong_FromLong(n == -1 ? -1 : -2);
            break;
        }
        const unsigned char *m = (const unsigned char *)buf;
        uint64_t start = n >= XLOGDATA_HEADER ? be64(m + 1) : 0;
        if (n < XLOGDATA_HEADER || m[0] != 'w' || (m[FLAG_OFFSET] & FLAG_BIT)
                || (count > 0 && !scattered && start != next_lsn)) {
            other = PyBytes_FromStringAndSize(buf, n);  /* Python's path takes it from here */
            pq_freemem(buf);
            break;
        }
        uint64_t message_end = be64(m + 9); /* read before a scattered run frees buf */
        /* scattered: bytes (see the header comment); WAL stays in libpq's buffers */
        PyObject *view;
        if (scattered) {
            view = PyBytes_FromStringAndSize(buf + XLOGDATA_HEADER, n - XLOGDATA_HEADER);
            pq_freemem(buf);
        }
        else
            view = payload_view(buf, XLOGDATA_HEADER, n - XLOGDATA_HEADER);
        if (view == NULL || PyList_Append(payloads, view) < 0) {
            Py_XDECREF(view);
            Py_DECREF(payloads);
            Py_DECREF(starts);
            return NULL;
        }
        Py_DECREF(view);
        if (scattered) {
            PyObject *at = PyLong_FromUnsignedLongLong(start);
            if (at == NULL || PyList_Append(starts, at) < 0) {
                Py_XDECREF(at);
                Py_DECREF(payloads);
                Py_DECREF(starts);
                return NULL;
            }
            Py_DECREF(at);
        }
        if (count == 0)
            wal_start = start;
        wal_end = message_end;
        next_lsn = start + (uint64_t)(n - XLOGDATA_HEADER);
        wal_bytes += n - XLOGDATA_HEADER;
        wire += n;
        count++;
    }
    if (other == NULL) {
        if (PyErr_Occurred()) {
            Py_DECREF(payloads);
            Py_DECREF(starts);
            return NULL;
        }
        other = Py_NewRef(Py_None);
    }
    return Py_BuildValue("(KKNnNN)", (unsigned long long)wal_start, (unsigned long long)wal_end,
                         payloads, wire, other, starts);
}

static PyObject *
recv_bind(PyObject *module, PyObject *arg)
{
    const char *path = PyUnicode_AsUTF8(arg);
    if (path == NULL)
        return NULL;
    void *lib = dlopen(path, RTLD_NOW | RTLD_NOLOAD);  /* only a library already loaded */
    if (lib == NULL) {
        PyErr_Format(PyExc_OSError, "libpq %s is not loaded in this process", path);
        return NULL;
    }
    get_copy_data_fn get = (get_copy_data_fn)dlsym(lib, "PQgetCopyData");
    consume_input_fn consume = (consume_input_fn)dlsym(lib, "PQconsumeInput");
    freemem_fn freemem = (freemem_fn)dlsym(lib, "PQfreemem");
    if (get == NULL || consume == NULL || freemem == NULL) {
        PyErr_Format(PyExc_OSError, "%s lacks PQgetCopyData, PQconsumeInput or PQfreemem",
                     path);
        return NULL;
    }
    pq_get_copy_data = get;  /* the handle stays open: the functions must outlive this call */
    pq_consume_input = consume;
    pq_freemem = freemem;
    Py_RETURN_NONE;
}

static PyMethodDef recv_methods[] = {
    {"bind", recv_bind, METH_O,
     "bind(libpq_path) resolves the libpq functions in the libpq already loaded from there."},
    {"read", recv_read, METH_VARARGS,
     "read(pgconn_ptr, max_bytes, max_messages, until[, scattered]) -> (wal_start, wal_end, "
     "payloads, wire, other, starts): the plain XLogData messages that have arrived, their WAL "
     "contiguous (scattered: any walStart, each in starts)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef recv_module = {
    PyModuleDef_HEAD_INIT, "_recv", "The COPY stream's compiled receive loop.", -1,
    recv_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__recv(void)
{
    if (PyType_Ready(&PQBufferType) < 0)
        return NULL;
    return PyModule_Create(&recv_module);
}
