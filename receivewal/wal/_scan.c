/*
 * receivewal.wal._scan: the compiled hot loop of the segment scanner (optional).
 *
 * The pure-Python scanner in receivewal/wal/reader.py and receivewal/wal/pages.py is the
 * reference; this module does the same work for the common case only:
 *
 *   check_pages(buf, n_pages, start_lsn, timeline, segment_size, magic)
 *       checks page headers from the first page on and stops at the first page that has
 *       anything to report (Python goes on from there and reports it); every page must carry
 *       ``magic``, the segment's (Python decides it: the first page's when that is a known
 *       major's, receivewal/wal/majors.py; 0, which no page matches, when it is not);
 *   walk(buf, pos, end_data, page_ok, start_lsn, have_prev, prev, data_len, partial,
 *        counts, rec_bytes, fpi_bytes, lsns)
 *       walks records from pos while each one is accepted without a finding, and stops at
 *       the first record (or page boundary) that needs a closer look;
 *   crc32c(data, value=0), crc32c_impl()
 *       CRC-32C (Castagnoli) with SSE4.2 when the CPU has it (runtime cpuid check),
 *       slicing-by-8 in software otherwise.
 *
 * Both paths therefore give the same results: C never reports, it only skips ahead over
 * what Python would accept silently. The layouts are PostgreSQL 15's to 18's, the same in each
 * (xlog_internal.h, xlogrecord.h); only the page magic differs, and it comes as a parameter.
 *
 * Bounds: both functions read whole pages only, and only pages that lie in the buffer (and,
 * for walk, in the page list) they are handed, whatever n_pages, end_data or pos say; a
 * record is copied only after every page it spans passed that test. Nothing relies on the
 * Python caller padding a .partial to whole pages (tests/support/cbounds.py hands them
 * short buffers that end at an unreadable page).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <nmmintrin.h>
#define SCAN_HAVE_SSE42_CODE 1
#endif

#define BLCKSZ 8192
#define PAGE_MASK (BLCKSZ - 1)
#define SHORT_PHD 24
#define RECORD_HEADER 24
#define XLP_FIRST_IS_CONTRECORD 0x0001
#define XLP_LONG_HEADER 0x0002
#define XLP_FIRST_IS_OVERWRITE_CONTRECORD 0x0008
#define XLP_ALL_FLAGS 0x000F
#define MAX_RECORD_LENGTH 0x3FFFDFFFu /* as records.py: the longest record PostgreSQL 15 reads */
#define RM_MAX_BUILTIN_ID 21 /* as rmgr.py: rmgr_id_is_valid */
#define RM_MIN_CUSTOM_ID 128
#define NKEYS 4096

/* ---------------------------------------------------------------- CRC-32C */
static uint32_t crc_table[8][256];
static int have_sse42 = 0;

static void
crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xFF];
#ifdef SCAN_HAVE_SSE42_CODE
    unsigned int eax, ebx, ecx, edx;
    if (__get_cpuid(1, &eax, &ebx, &ecx, &edx))
        have_sse42 = (ecx & bit_SSE4_2) != 0;
#endif
}

static uint32_t
crc_sw(uint32_t crc, const uint8_t *p, size_t n)
{
    while (n && ((uintptr_t) p & 7)) {
        crc = crc_table[0][(crc ^ *p++) & 0xFF] ^ (crc >> 8);
        n--;
    }
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        w ^= crc;
        crc = crc_table[7][w & 0xFF] ^ crc_table[6][(w >> 8) & 0xFF] ^
              crc_table[5][(w >> 16) & 0xFF] ^ crc_table[4][(w >> 24) & 0xFF] ^
              crc_table[3][(w >> 32) & 0xFF] ^ crc_table[2][(w >> 40) & 0xFF] ^
              crc_table[1][(w >> 48) & 0xFF] ^ crc_table[0][w >> 56];
        p += 8;
        n -= 8;
    }
    while (n--)
        crc = crc_table[0][(crc ^ *p++) & 0xFF] ^ (crc >> 8);
    return crc;
}

#ifdef SCAN_HAVE_SSE42_CODE
__attribute__((target("sse4.2"))) static uint32_t
crc_hw(uint32_t crc, const uint8_t *p, size_t n)
{
    uint64_t c = crc;
    while (n && ((uintptr_t) p & 7)) {
        c = _mm_crc32_u8((uint32_t) c, *p++);
        n--;
    }
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c = _mm_crc32_u64(c, w);
        p += 8;
        n -= 8;
    }
    while (n--)
        c = _mm_crc32_u8((uint32_t) c, *p++);
    return (uint32_t) c;
}
#endif

/* The running CRC register (not inverted): start from 0xFFFFFFFF, invert at the end. */
static inline uint32_t
crc_update(uint32_t crc, const uint8_t *p, size_t n)
{
#ifdef SCAN_HAVE_SSE42_CODE
    if (have_sse42)
        return crc_hw(crc, p, n);
#endif
    return crc_sw(crc, p, n);
}

/* ---------------------------------------------------------------- helpers */
static inline uint16_t
u16(const uint8_t *p)
{
    return (uint16_t) (p[0] | p[1] << 8);
}

static inline uint32_t
u32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v; /* little-endian hosts only, as PostgreSQL's WAL on them */
}

static inline uint64_t
u64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* Full-page-image bytes of the block headers rec[off:end], or -1 when malformed: the same
 * decoding as block_references() in receivewal/wal/records.py (PostgreSQL's DecodeXLogRecord). */
static int64_t
fpi_bytes_of(const uint8_t *rec, int64_t off, int64_t end)
{
    int64_t remaining = end - off, datatotal = 0, fpi = 0;
    int max_block = -1, have_rel = 0;
    while (remaining > datatotal) {
        int bid = rec[off];
        if (bid == 255) {
            if (off + 2 > end) return -1;
            datatotal += rec[off + 1];
            remaining -= 2;
            break;
        }
        if (bid == 254) {
            if (off + 5 > end) return -1;
            datatotal += u32(rec + off + 1);
            remaining -= 5;
            break;
        }
        if (bid == 253) { off += 3; remaining -= 3; continue; }
        if (bid == 252) { off += 5; remaining -= 5; continue; }
        if (bid > 32 || bid <= max_block) return -1;
        max_block = bid;
        if (off + 4 > end) return -1;
        int fork_flags = rec[off + 1];
        int data_len = u16(rec + off + 2);
        off += 4;
        remaining -= 4;
        if (((fork_flags & 0x20) == 0) != (data_len == 0)) return -1;
        datatotal += data_len;
        if (fork_flags & 0x10) {
            if (off + 5 > end) return -1;
            int bimg_len = u16(rec + off);
            int bimg_info = rec[off + 4];
            off += 5;
            remaining -= 5;
            if ((bimg_info & (0x04 | 0x08 | 0x10)) && (bimg_info & 0x01)) {
                off += 2;
                remaining -= 2;
            }
            if (bimg_len == 0 || bimg_len > BLCKSZ) return -1;
            datatotal += bimg_len;
            fpi += bimg_len;
        }
        if (fork_flags & 0x80) {
            if (!have_rel) return -1;
        } else {
            have_rel = 1;
            off += 12;
            remaining -= 12;
        }
        off += 4;
        remaining -= 4;
    }
    return remaining == datatotal ? fpi : -1;
}

/* ---------------------------------------------------------------- check_pages */
/* A page passes when receivewal/wal/pageheader.py's page_header_problem() has nothing to say
 * about it: the same checks, in the same order (magic, info bits, page address, timeline, the
 * timeline sequence, then the long header of the first page and only there). The first page
 * that fails stops the loop; Python judges it and says why. */
static PyObject *
scan_check_pages(PyObject *self, PyObject *args)
{
    Py_buffer view;
    Py_ssize_t n_pages;
    unsigned long long start_lsn;
    unsigned long timeline, segment_size, page_magic;
    if (!PyArg_ParseTuple(args, "y*nKkkk", &view, &n_pages, &start_lsn, &timeline, &segment_size,
                          &page_magic))
        return NULL;
    const uint8_t *buf = view.buf;
    /* only whole pages of the buffer: never trust n_pages (nor let n_pages * BLCKSZ overflow) */
    if (n_pages < 0) n_pages = 0;
    if (n_pages > view.len / BLCKSZ) n_pages = view.len / BLCKSZ;
    PyObject *tlis = PyList_New(0), *flags = PyList_New(0), *rems = PyList_New(0);
    PyObject *sysid = Py_None;
    Py_INCREF(Py_None);
    Py_ssize_t p = 0;
    uint32_t prev_tli = 0;
    if (!tlis || !flags || !rems) goto fail;
    for (; p < n_pages; p++) {
        const uint8_t *h = buf + p * BLCKSZ;
        unsigned magic = u16(h), info = u16(h + 2);
        uint32_t tli = u32(h + 4), rem = u32(h + 16);
        uint64_t addr = u64(h + 8), lsn = start_lsn + (uint64_t) p * BLCKSZ;
        if (magic != page_magic || (info & ~XLP_ALL_FLAGS) || addr != lsn || tli == 0 ||
            tli > timeline || tli < prev_tli)
            break;
        if (p == 0) {
            if (!(info & XLP_LONG_HEADER) || u32(h + 32) != segment_size || u32(h + 36) != BLCKSZ)
                break;
            Py_DECREF(sysid);
            sysid = PyLong_FromUnsignedLongLong(u64(h + 24));
            if (!sysid) goto fail;
        } else if (info & XLP_LONG_HEADER) {
            break;
        }
        if (tli != prev_tli) {
            PyObject *t = Py_BuildValue("(KI)", (unsigned long long) lsn, (unsigned) tli);
            if (!t || PyList_Append(tlis, t) < 0) { Py_XDECREF(t); goto fail; }
            Py_DECREF(t);
        }
        prev_tli = tli;
        PyObject *f = PyLong_FromUnsignedLong(info), *r = PyLong_FromUnsignedLong(rem);
        int bad = !f || !r || PyList_Append(flags, f) < 0 || PyList_Append(rems, r) < 0;
        Py_XDECREF(f);
        Py_XDECREF(r);
        if (bad) goto fail;
    }
    PyBuffer_Release(&view);
    return Py_BuildValue("(nNNNN)", p, sysid, tlis, flags, rems);
fail:
    PyBuffer_Release(&view);
    Py_XDECREF(tlis);
    Py_XDECREF(flags);
    Py_XDECREF(rems);
    Py_XDECREF(sysid);
    return NULL;
}

/* ---------------------------------------------------------------- walk */
typedef struct {
    int64_t counts[NKEYS], rec_bytes[NKEYS], fpi_bytes[NKEYS];
} Totals;

static int
add_totals(PyObject *list, const int64_t *values)
{
    if (!PyList_Check(list) || PyList_GET_SIZE(list) < NKEYS) {
        PyErr_SetString(PyExc_ValueError, "walk: totals must be lists of 4096 ints");
        return -1;
    }
    for (int k = 0; k < NKEYS; k++) {
        if (!values[k]) continue;
        PyObject *old = PyList_GET_ITEM(list, k);
        PyObject *add = PyLong_FromLongLong(values[k]);
        if (!add) return -1;
        PyObject *sum = PyNumber_Add(old, add);
        Py_DECREF(add);
        if (!sum) return -1;
        PyList_SetItem(list, k, sum); /* steals sum, releases old */
    }
    return 0;
}

/* The hot loop: one pass over the records of a segment, documented above. */
static PyObject *
scan_walk(PyObject *self, PyObject *args)
{
    Py_buffer view, okv;
    Py_ssize_t pos, end_data, data_len;
    unsigned long long start_lsn, prev;
    int have_prev, partial;
    PyObject *counts, *rec_bytes, *fpi_bytes, *lsns;
    if (!PyArg_ParseTuple(args, "y*nny*KpKnpOOOO", &view, &pos, &end_data, &okv, &start_lsn,
                          &have_prev, &prev, &data_len, &partial, &counts, &rec_bytes,
                          &fpi_bytes, &lsns))
        return NULL;
    const uint8_t *buf = view.buf;
    const uint8_t *page_ok = okv.buf;
    if (pos < 0) {
        PyBuffer_Release(&view);
        PyBuffer_Release(&okv);
        PyErr_SetString(PyExc_ValueError, "walk: negative position");
        return NULL;
    }
    /* The walk reads whole pages only, each both in the buffer and in the page list, so
     * every read below stays within view.len and okv.len whatever the caller passes (the
     * Python caller pads a .partial to whole pages; nothing here relies on it). */
    Py_ssize_t n_pages = okv.len;
    if (n_pages > view.len / BLCKSZ) n_pages = view.len / BLCKSZ;
    if (end_data > n_pages * BLCKSZ) end_data = n_pages * BLCKSZ;
    end_data &= ~(Py_ssize_t) PAGE_MASK;
    Totals *tot = calloc(1, sizeof(Totals));
    uint8_t *scratch = NULL;
    size_t scratch_size = 0;
    int have_first = 0, switched = 0, failed = 0;
    unsigned long long first_lsn = 0, first_prev = 0, last = 0;
    int have_last = 0;
    if (!tot) { failed = 1; PyErr_NoMemory(); goto done; }
    while (pos < end_data) {
        if (!(pos & PAGE_MASK)) {
            Py_ssize_t p = pos / BLCKSZ;
            if (!page_ok[p] || (u16(buf + pos + 2) & XLP_FIRST_IS_CONTRECORD))
                break;
            pos += SHORT_PHD;
        }
        Py_ssize_t page_end = (pos | PAGE_MASK) + 1;
        if (page_end - pos < 4) /* xl_tot_len split by a page boundary: pos is not aligned */
            break;
        uint32_t tot_len = u32(buf + pos);
        if (tot_len < RECORD_HEADER || tot_len > MAX_RECORD_LENGTH)
            break;
        const uint8_t *rec;
        Py_ssize_t end;
        if ((Py_ssize_t) tot_len <= page_end - pos) {
            rec = buf + pos;
            end = pos + tot_len;
        } else {
            /* crosses pages: every continuation header must continue it */
            Py_ssize_t got = page_end - pos, p = page_end / BLCKSZ;
            int ok = 1;
            end = page_end;
            while (got < (Py_ssize_t) tot_len) {
                if (p >= n_pages || !page_ok[p]) { ok = 0; break; }
                const uint8_t *h = buf + p * BLCKSZ;
                unsigned info = u16(h + 2);
                if ((info & XLP_FIRST_IS_OVERWRITE_CONTRECORD) ||
                    !(info & XLP_FIRST_IS_CONTRECORD) || u32(h + 16) != tot_len - got) {
                    ok = 0;
                    break;
                }
                Py_ssize_t take = tot_len - got;
                if (take > BLCKSZ - SHORT_PHD) take = BLCKSZ - SHORT_PHD;
                got += take;
                end = p * BLCKSZ + SHORT_PHD + take;
                p++;
            }
            if (!ok) break;
            if (scratch_size < tot_len) {
                uint8_t *bigger = realloc(scratch, tot_len);
                if (!bigger) { failed = 1; PyErr_NoMemory(); goto done; }
                scratch = bigger;
                scratch_size = tot_len;
            }
            size_t at = page_end - pos;
            memcpy(scratch, buf + pos, at);
            for (p = page_end / BLCKSZ; at < tot_len; p++) {
                size_t take = tot_len - at;
                if (take > BLCKSZ - SHORT_PHD) take = BLCKSZ - SHORT_PHD;
                memcpy(scratch + at, buf + p * BLCKSZ + SHORT_PHD, take);
                at += take;
            }
            rec = scratch;
        }
        if (partial && end > data_len)
            break;
        uint64_t prev_link = u64(rec + 8);
        unsigned info = rec[16], rmid = rec[17];
        /* records.py's judge_record, in its order: rmid, xl_prev, CRC, block references */
        if (!(rmid <= RM_MAX_BUILTIN_ID || rmid >= RM_MIN_CUSTOM_ID) ||
            (have_prev && prev_link != prev))
            break;
        uint32_t crc = crc_update(0xFFFFFFFFu, rec + RECORD_HEADER, tot_len - RECORD_HEADER);
        crc = crc_update(crc, rec, 20) ^ 0xFFFFFFFFu;
        if (crc != u32(rec + 20))
            break;
        int64_t fpi = fpi_bytes_of(rec, RECORD_HEADER, tot_len);
        if (fpi < 0)
            break;
        unsigned long long lsn = start_lsn + (unsigned long long) pos;
        int key = rmid << 4 | info >> 4;
        tot->counts[key]++;
        tot->rec_bytes[key] += (int64_t) tot_len - fpi;
        tot->fpi_bytes[key] += fpi;
        if (lsns != Py_None) {
            PyObject *l = PyLong_FromUnsignedLongLong(lsn);
            if (!l || PyList_Append(lsns, l) < 0) { Py_XDECREF(l); failed = 1; goto done; }
            Py_DECREF(l);
        }
        if (!have_first) {
            have_first = 1;
            first_lsn = lsn;
            first_prev = prev_link;
        }
        prev = last = lsn;
        have_prev = have_last = 1;
        pos = (end + 7) & ~(Py_ssize_t) 7;
        if (rmid == 0 && (info & 0xF0) == 0x40) { /* XLOG_SWITCH */
            switched = 1;
            break;
        }
    }
    if (add_totals(counts, tot->counts) < 0 || add_totals(rec_bytes, tot->rec_bytes) < 0 ||
        add_totals(fpi_bytes, tot->fpi_bytes) < 0)
        failed = 1;
done:
    free(tot);
    free(scratch);
    PyBuffer_Release(&view);
    PyBuffer_Release(&okv);
    if (failed) return NULL;
    PyObject *o_prev = have_prev ? PyLong_FromUnsignedLongLong(prev) : Py_NewRef(Py_None);
    PyObject *o_last = have_last ? PyLong_FromUnsignedLongLong(last) : Py_NewRef(Py_None);
    PyObject *o_first = have_first ? PyLong_FromUnsignedLongLong(first_lsn) : Py_NewRef(Py_None);
    PyObject *o_fprev = have_first ? PyLong_FromUnsignedLongLong(first_prev) : Py_NewRef(Py_None);
    return Py_BuildValue("(nNNNNO)", pos, o_prev, o_last, o_first, o_fprev,
                         switched ? Py_True : Py_False);
}

/* ---------------------------------------------------------------- crc32c */
static PyObject *
scan_crc32c(PyObject *self, PyObject *args)
{
    Py_buffer view;
    unsigned long value = 0;
    if (!PyArg_ParseTuple(args, "y*|k", &view, &value))
        return NULL;
    uint32_t crc;
    Py_BEGIN_ALLOW_THREADS
    crc = crc_update((uint32_t) value ^ 0xFFFFFFFFu, view.buf, (size_t) view.len) ^ 0xFFFFFFFFu;
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(crc);
}

static PyObject *
scan_crc32c_impl(PyObject *self, PyObject *unused)
{
    return PyUnicode_FromString(have_sse42 ? "sse4.2" : "software");
}

static PyObject *
scan_force_software_crc(PyObject *self, PyObject *arg)
{
    int on = PyObject_IsTrue(arg);
    if (on < 0) return NULL;
    if (on) {
        have_sse42 = 0;
    } else {
        crc_init();
    }
    Py_RETURN_NONE;
}

static PyMethodDef scan_methods[] = {
    {"check_pages", scan_check_pages, METH_VARARGS,
     "check_pages(buf, n_pages, start_lsn, timeline, segment_size) -> (n_good, sysid, tlis, "
     "flags, rems): the leading pages whose headers have nothing to report."},
    {"walk", scan_walk, METH_VARARGS,
     "walk(buf, pos, end_data, page_ok, start_lsn, have_prev, prev, data_len, partial, counts, "
     "rec_bytes, fpi_bytes, lsns) -> (pos, prev, last, first_lsn, first_prev, switched)."},
    {"crc32c", scan_crc32c, METH_VARARGS, "crc32c(data, value=0) -> CRC-32C of data."},
    {"crc32c_impl", scan_crc32c_impl, METH_NOARGS, "'sse4.2' or 'software'."},
    {"force_software_crc", scan_force_software_crc, METH_O,
     "force_software_crc(True) uses the table-driven CRC even on SSE4.2 (for the tests)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef scan_module = {
    PyModuleDef_HEAD_INIT, "_scan", "The segment scanner's compiled hot loop.", -1, scan_methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__scan(void)
{
    crc_init();
    return PyModule_Create(&scan_module);
}
