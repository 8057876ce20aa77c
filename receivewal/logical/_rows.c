/*
 * receivewal.logical._rows: the compiled line of a plain pgoutput row (optional).
 *
 *   plain_text_line(data, position, keys, lead, lsn, xid, table, tail)
 *       when the TupleData that starts at position in data is plain, the whole change log
 *       line of it; None otherwise. Plain: len(keys) columns (at most 1664, PostgreSQL's
 *       limit), each NULL ('n') or text ('t') with a length that fits and bytes all
 *       printable ASCII that JSON writes as they are (0x20..0x7f but '"' and '\\'), and the
 *       row ends exactly where data ends. The line: lead, the LSN as %X/%X, '","xid":', xid
 *       in decimal, table, then for each column its key (the JSON of its name, a colon and
 *       the opening quote; a comma before all but the first), its value and a closing quote
 *       (a NULL: the key without its opening quote, then null), then tail.
 *
 * It is receivewal/logical/rowlines.py's python_plain_text_line, which is the reference (the
 * tests run both): C never decides anything Python would not; a row it returns None for goes
 * the value-by-value way (which takes unchanged TOAST, escapes and UTF-8, or leaves the
 * message to the reference decoder and its errors). It reads only within data.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define MAX_COLUMNS 1664 /* PostgreSQL's MaxTupleAttributeNumber */

typedef struct {
    Py_ssize_t start, length;
} Span;

/* The values of a plain row (see the header comment) as spans of data, or -1 if not plain. */
static int
read_plain(const unsigned char *data, Py_ssize_t end, Py_ssize_t position, Py_ssize_t count,
           Span *spans)
{
    if (position < 0 || count < 0 || count > MAX_COLUMNS || position > end || end - position < 2
        || ((Py_ssize_t)data[position] << 8 | data[position + 1]) != count)
        return -1;
    position += 2;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (end - position >= 1 && data[position] == 'n') { /* NULL */
            spans[i].start = -1;
            spans[i].length = 0;
            position += 1;
            continue;
        }
        if (end - position < 5 || data[position] != 't')
            return -1;
        uint32_t length = (uint32_t)data[position + 1] << 24 | (uint32_t)data[position + 2] << 16
                          | (uint32_t)data[position + 3] << 8 | data[position + 4];
        position += 5;
        if (length > 0x7fffffffu || (Py_ssize_t)length > end - position)
            return -1;
        const unsigned char *value = data + position;
        for (uint32_t j = 0; j < length; j++) {
            unsigned char c = value[j];
            if (c < 0x20 || c > 0x7f || c == '"' || c == '\\')
                return -1;
        }
        spans[i].start = position;
        spans[i].length = (Py_ssize_t)length;
        position += (Py_ssize_t)length;
    }
    return position == end ? 0 : -1;
}

/* plain_text_line(data, position, keys, lead, lsn, xid, table, tail): see the header. */
static PyObject *
rows_plain_text_line(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "plain_text_line takes 8 arguments");
        return NULL;
    }
    PyObject *keys = args[2], *lead_o = args[3], *table_o = args[6], *tail_o = args[7];
    if (!PyTuple_Check(keys) || !PyBytes_Check(lead_o) || !PyBytes_Check(table_o)
        || !PyBytes_Check(tail_o)) {
        PyErr_SetString(PyExc_TypeError, "keys must be a tuple; lead, table and tail bytes");
        return NULL;
    }
    Py_ssize_t position = PyLong_AsSsize_t(args[1]);
    unsigned long long lsn = PyLong_AsUnsignedLongLong(args[4]);
    unsigned long long xid = PyLong_AsUnsignedLongLong(args[5]);
    if (PyErr_Occurred())
        return NULL;
    const char *lead = PyBytes_AS_STRING(lead_o), *table = PyBytes_AS_STRING(table_o),
               *tail = PyBytes_AS_STRING(tail_o);
    Py_ssize_t lead_len = PyBytes_GET_SIZE(lead_o), table_len = PyBytes_GET_SIZE(table_o),
               tail_len = PyBytes_GET_SIZE(tail_o);
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    Py_ssize_t count = PyTuple_GET_SIZE(keys);
    Span spans[MAX_COLUMNS];
    if (read_plain(view.buf, view.len, position, count, spans) < 0) {
        PyBuffer_Release(&view);
        Py_RETURN_NONE;
    }
    char numbers[64];
    int numbers_len = snprintf(numbers, sizeof numbers, "%llX/%llX\",\"xid\":%llu",
                               lsn >> 32, lsn & 0xFFFFFFFFull, xid);
    Py_ssize_t size = lead_len + numbers_len + table_len + tail_len;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *key = PyTuple_GET_ITEM(keys, i);
        if (!PyBytes_Check(key)) {
            PyBuffer_Release(&view);
            PyErr_SetString(PyExc_TypeError, "keys must be bytes");
            return NULL;
        }
        if (PyBytes_GET_SIZE(key) < 1) {
            PyBuffer_Release(&view);
            PyErr_SetString(PyExc_ValueError, "a key ends with the value's opening quote");
            return NULL;
        }
        /* a value and its closing quote; NULL: null instead of both quotes */
        size += PyBytes_GET_SIZE(key) + (spans[i].start < 0 ? 3 : spans[i].length + 1);
    }
    PyObject *line = PyBytes_FromStringAndSize(NULL, size);
    if (line == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    char *out = PyBytes_AS_STRING(line);
    memcpy(out, lead, (size_t)lead_len);
    out += lead_len;
    memcpy(out, numbers, (size_t)numbers_len);
    out += numbers_len;
    memcpy(out, table, (size_t)table_len);
    out += table_len;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *key = PyTuple_GET_ITEM(keys, i);
        if (spans[i].start < 0) { /* the key without its opening quote, then null */
            memcpy(out, PyBytes_AS_STRING(key), (size_t)PyBytes_GET_SIZE(key) - 1);
            out += PyBytes_GET_SIZE(key) - 1;
            memcpy(out, "null", 4);
            out += 4;
            continue;
        }
        memcpy(out, PyBytes_AS_STRING(key), (size_t)PyBytes_GET_SIZE(key));
        out += PyBytes_GET_SIZE(key);
        memcpy(out, (const char *)view.buf + spans[i].start, (size_t)spans[i].length);
        out += spans[i].length;
        *out++ = '"';
    }
    memcpy(out, tail, (size_t)tail_len);
    PyBuffer_Release(&view);
    return line;
}

static PyMethodDef rows_methods[] = {
    {"plain_text_line", (PyCFunction)(void (*)(void))rows_plain_text_line, METH_FASTCALL,
     "plain_text_line(data, position, keys, lead, lsn, xid, table, tail) -> the line, or None."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef rows_module = {
    PyModuleDef_HEAD_INIT, "_rows", "The compiled line of a plain pgoutput row.", -1,
    rows_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__rows(void)
{
    return PyModule_Create(&rows_module);
}
