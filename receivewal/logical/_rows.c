/*
 * receivewal.logical._rows: the compiled reader of a plain pgoutput row (optional).
 *
 *   plain_text_row(data, position, count)
 *       the values of the TupleData that starts at position in data, as a tuple of bytes,
 *       when it has count columns, each of kind 't' with a length that fits, its bytes all
 *       printable ASCII that JSON writes as they are (0x20..0x7f but '"' and '\\'), and it
 *       ends exactly where data ends; None otherwise.
 *
 * It is receivewal/logical/rowlines.py's plain_text_row, which is the reference (the tests
 * run both): C never decides anything Python would not; a row it returns None for goes the
 * pure-Python way (which takes NULLs, unchanged TOAST, escapes and UTF-8, or leaves the
 * message to the reference decoder and its errors). It reads only within data.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

static PyObject *
rows_plain_text_row(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer view;
    Py_ssize_t position, count;
    if (!PyArg_ParseTuple(args, "y*nn", &view, &position, &count))
        return NULL;
    const unsigned char *data = view.buf;
    Py_ssize_t end = view.len;
    PyObject *values = NULL;
    if (position < 0 || count < 0 || position > end || end - position < 2
        || ((Py_ssize_t)data[position] << 8 | data[position + 1]) != count)
        goto none;
    position += 2;
    values = PyTuple_New(count);
    if (values == NULL)
        goto fail;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (end - position < 5 || data[position] != 't')
            goto none;
        uint32_t length = (uint32_t)data[position + 1] << 24 | (uint32_t)data[position + 2] << 16
                          | (uint32_t)data[position + 3] << 8 | data[position + 4];
        position += 5;
        if (length > 0x7fffffffu || (Py_ssize_t)length > end - position)
            goto none;
        const unsigned char *value = data + position;
        for (uint32_t j = 0; j < length; j++) {
            unsigned char c = value[j];
            if (c < 0x20 || c > 0x7f || c == '"' || c == '\\')
                goto none;
        }
        PyObject *item = PyBytes_FromStringAndSize((const char *)value, (Py_ssize_t)length);
        if (item == NULL)
            goto fail;
        PyTuple_SET_ITEM(values, i, item);
        position += (Py_ssize_t)length;
    }
    if (position != end)
        goto none;
    PyBuffer_Release(&view);
    return values;
none:
    Py_XDECREF(values);
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
fail:
    Py_XDECREF(values);
    PyBuffer_Release(&view);
    return NULL;
}

static PyMethodDef rows_methods[] = {
    {"plain_text_row", rows_plain_text_row, METH_VARARGS,
     "plain_text_row(data, position, count) -> tuple of the row's text values, or None."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef rows_module = {
    PyModuleDef_HEAD_INIT, "_rows", "The compiled reader of a plain pgoutput row.", -1,
    rows_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__rows(void)
{
    return PyModule_Create(&rows_module);
}
