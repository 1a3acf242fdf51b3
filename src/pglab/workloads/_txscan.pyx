# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True
"""The lines of pgbench's per-transaction logs, scanned by compiled code: the three fields the figures need
converted, nothing else kept (pglab.workloads.txscan is the Python side, and says why)."""

from cpython.buffer cimport PyBUF_C_CONTIGUOUS, PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer

cdef enum:
    SPACE = 32
    NEWLINE = 10
    MAX_DIGITS = 18  # up to 18 digits fit int64
    MAX_END_DIGITS = 12  # seconds and µs of an end time: their µs sum still fits int64
    SHORTEST_LINE = 12  # "0 0 0 0 0 0\n": a block of n bytes holds at most n // 12 + 1 transactions

cdef enum Kind:
    TRANSACTION, FAILED, SKIPPED, OTHER


cdef inline bint odd(unsigned char c) noexcept nogil:
    """A byte str.split() or a file read as text would cut at, other than a single space or a newline: tab,
    vertical tab, form feed, carriage return, the four information separators; or a byte past ASCII."""
    return c == 9 or c == 11 or c == 12 or c == 13 or 28 <= c <= 31 or c >= 128


cdef inline bint is_word(const unsigned char* at, Py_ssize_t length, const char* word, Py_ssize_t size) noexcept nogil:
    cdef Py_ssize_t k
    if length != size:
        return False
    for k in range(size):
        if at[k] != <unsigned char>word[k]:
            return False
    return True


cdef Py_ssize_t scan(const unsigned char* buf, Py_ssize_t n, long long* latency, long long* end, double* failed,
                     Py_ssize_t* counts) noexcept nogil:
    """The scan itself (see scan_into); counts: ok, lost, skipped. Returns 1 if every line was plain, else 0."""
    cdef Py_ssize_t i = 0, start, length, ok = 0, lost = 0, skipped = 0
    cdef int field
    cdef Kind kind
    cdef unsigned long long value  # wraps past 20 digits (defined); such a number is refused anyway
    cdef long long time, seconds, micros
    cdef unsigned char c
    cdef bint digits, plain_end, plain = True
    while i < n and plain:
        field = 0
        kind = TRANSACTION
        time = seconds = micros = 0
        plain_end = True
        while True:  # a field a turn, to the line's end
            start = i
            value = 0
            digits = True
            while True:
                c = buf[i]
                if 48 <= c <= 57:
                    value = value * 10 + (c - 48)
                elif c == SPACE or c == NEWLINE:
                    break
                elif odd(c):
                    plain = False
                    break
                else:
                    digits = False
                i += 1
            length = i - start
            if not plain or length == 0 or (digits and length > MAX_DIGITS):  # an empty field: a doubled,
                plain = False  # leading or trailing space, or an empty line
                break
            if field == 2:
                if digits:
                    time = <long long>value
                elif is_word(buf + start, length, b"failed", 6):
                    kind = FAILED
                elif is_word(buf + start, length, b"skipped", 7):
                    kind = SKIPPED
                else:
                    kind = OTHER
            elif field == 4:
                seconds = <long long>value
                plain_end = plain_end and digits and length <= MAX_END_DIGITS
            elif field == 5:
                micros = <long long>value
                plain_end = plain_end and digits and length <= MAX_END_DIGITS
            field += 1
            i += 1
            if c == NEWLINE:
                break
        if not plain or field < 6 or kind == OTHER:
            continue
        if kind == SKIPPED:
            skipped += 1
        elif not plain_end:  # int() would raise, or read what is no plain integer: the line rule decides
            plain = False
        elif kind == TRANSACTION:
            latency[ok] = time
            end[ok] = seconds * 1000000 + micros
            ok += 1
        else:
            failed[lost] = <double>seconds + micros / 1e6
            lost += 1
    counts[0], counts[1], counts[2] = ok, lost, skipped
    return plain


def scan_into(data, latency, end, failed):
    """Fills ``latency`` (µs), ``end`` (µs since the epoch) and ``failed`` (end times in s, as the former reader
    computed them: seconds + µs / 1e6), C-contiguous int64, int64 and float64 arrays, from ``data``, bytes of whole
    lines each ending in a newline; each output has room for a transaction per line. Returns how many of each, the
    skipped count, and whether every line was plain (if not, the outputs are partly filled and the block must take
    the line rule). Buffers rather than typed memoryviews: the module compiles in a second, not in five."""
    cdef Py_buffer src, lat, ends, lost
    cdef Py_ssize_t counts[3]
    cdef Py_ssize_t room
    cdef bint plain
    PyObject_GetBuffer(data, &src, PyBUF_C_CONTIGUOUS)
    try:
        PyObject_GetBuffer(latency, &lat, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE)
        try:
            PyObject_GetBuffer(end, &ends, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE)
            try:
                PyObject_GetBuffer(failed, &lost, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE)
                try:
                    room = src.len // SHORTEST_LINE + 1
                    if src.len == 0 or (<const unsigned char*>src.buf)[src.len - 1] != NEWLINE:
                        raise ValueError("scan_into needs whole lines, the last ending in a newline")
                    if lat.len < room * 8 or ends.len < room * 8 or lost.len < room * 8:
                        raise ValueError(f"scan_into needs room for {room} transactions in each output")
                    with nogil:
                        plain = scan(<const unsigned char*>src.buf, src.len, <long long*>lat.buf,
                                     <long long*>ends.buf, <double*>lost.buf, counts)
                    return counts[0], counts[1], counts[2], plain
                finally:
                    PyBuffer_Release(&lost)
            finally:
                PyBuffer_Release(&ends)
        finally:
            PyBuffer_Release(&lat)
    finally:
        PyBuffer_Release(&src)
