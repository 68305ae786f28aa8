/*
 * A closed-loop load generator for any Kafka-protocol server: one process, one thread, epoll.
 *
 * It knows nothing of any API. The caller (ops/bench/cloadgen.py) gives it request frames
 * encoded once by kio and says which bytes change per connection and per request; this
 * program only copies bytes, patches them and reads a few fixed offsets of each answer, so
 * that its own cost per request is a small part of any server's (it reports that cost).
 *
 * Per connection: a private copy of each frame, patched once (a broker id, a transactional
 * id's digits, an incarnation id); then per request only the correlation id (bytes 8..11 of
 * every request frame with header v1 or v2) is written. Optional set-up frames are sent
 * first, one at a time (say a BrokerRegistration), and bytes of their answers can be copied
 * into later frames (the broker epoch into an AllocateProducerIds). Every answer is checked:
 * its correlation id must be the oldest one outstanding on that connection, its error code
 * (if the frame names where it is) must be 0, or the retriable code given with --retry.
 *
 * Two modes:
 *   load (default): N connections each keep K requests in flight for S seconds, after all
 *     have connected and done their set-up. Latencies go to a log-linear histogram (<1 %
 *     error); the window's own CPU time (getrusage) and that of each --pid process
 *     (/proc/PID/stat, every thread) are reported with the rate, with the time each spent
 *     runnable but waiting for a CPU (/proc/PID/task/TID/schedstat) and the machine's busy
 *     and stolen CPU (/proc/stat). A request answered with --retry's code is sent again
 *     after its delay, as a client would (Kafka's broker answers 14 until it holds a block
 *     of PIDs); only answers without an error count.
 *   storm (--storm): connection i starts at SPREAD * i / N seconds, does its set-up (an
 *     ApiVersions), then one request (an InitProducerId), retried after --retry's delay on
 *     the retriable code, and closes; reported is when each was served.
 *
 * Output: one JSON object on stdout. Failure: a message on stderr and exit status 1.
 *
 *   loadgen HOST:PORT [--connections N] [--in-flight K] [--seconds S]
 *           [--setup RH:ERR:HEX]... --request RH:ERR:HEX
 *           [--patch FRAME:OFFSET:WIDTH:BASE[:dec]]... [--capture FROM:BODYOFF:WIDTH:TO:OFFSET]...
 *           [--unique-key BODYOFF:WIDTH[,BODYOFF:WIDTH]] [--unique-blocks STARTOFF:LENOFF]
 *           [--retry CODE:MS] [--storm] [--spread S] [--deadline S] [--pid PID]...
 *
 * RH is the answer's header version (0: correlation id only; 1: then tagged fields), ERR the
 * error code's offset in the answer's body (-1: none). FRAME is a set-up frame's index or
 * "r" for the request; OFFSET counts from the frame's first byte (its length prefix).
 * A patch writes BASE + connection index, big-endian in WIDTH bytes, or with ":dec" as
 * WIDTH decimal digits. --unique-key: the answers' bytes that must never repeat (say the
 * producer id and epoch); --unique-blocks: an 8-byte start and a 4-byte length that must
 * never overlap another answer's.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_FRAMES 8     /* set-up frames plus the request */
#define MAX_PATCHES 16
#define MAX_CAPTURES 8
#define MAX_PIDS 8
#define READ_BYTES 65536
#define EVENTS 256
/* Histogram: values in ns; exact below 2^SUB_BITS+1, then 2^SUB_BITS sub-buckets per power. */
#define SUB_BITS 7
#define SUB (1 << SUB_BITS)
#define BUCKETS (2 * SUB + 48 * SUB)

static void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("loadgen: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* -- the histogram ------------------------------------------------------------------------ */

static uint64_t histogram[BUCKETS];
static uint64_t histogram_count, histogram_max;
static double histogram_sum;

static int bucket_of(uint64_t v) {
    if (v < 2 * SUB) return (int)v;
    int msb = 63 - __builtin_clzll(v);
    int shift = msb - SUB_BITS;
    int index = 2 * SUB + (shift - 1) * SUB + (int)((v >> shift) - SUB);
    return index < BUCKETS ? index : BUCKETS - 1;
}

static double bucket_middle(int index) {
    if (index < 2 * SUB) return (double)index;
    int shift = (index - 2 * SUB) / SUB + 1;
    uint64_t top = (uint64_t)((index - 2 * SUB) % SUB + SUB);
    return (double)(top << shift) + (double)((1ull << shift) / 2);
}

static void record(uint64_t ns) {
    histogram[bucket_of(ns)]++;
    histogram_count++;
    histogram_sum += (double)ns;
    if (ns > histogram_max) histogram_max = ns;
}

static double percentile_ms(double p) {
    if (!histogram_count) return 0.0;
    uint64_t rank = (uint64_t)(p * (double)histogram_count);
    if (rank >= histogram_count) rank = histogram_count - 1;
    uint64_t seen = 0;
    for (int i = 0; i < BUCKETS; i++) {
        seen += histogram[i];
        if (seen > rank) {
            double v = bucket_middle(i);
            return (v > (double)histogram_max ? (double)histogram_max : v) / 1e6;
        }
    }
    return (double)histogram_max / 1e6;
}

/* -- what the caller asked for --------------------------------------------------------------- */

typedef struct {
    unsigned char *bytes;
    size_t size;
    int response_header; /* 0 or 1 */
    int error_at;        /* the error code's offset in the answer's body, or -1 */
} frame_t;

typedef struct {
    int frame, offset, width, decimal;
    long long base;
} patch_t;

typedef struct {
    int from, body_offset, width, to, offset;
} capture_t;

static struct {
    const char *host, *port;
    int connections, in_flight;
    double seconds, spread, deadline;
    int storm;
    frame_t frames[MAX_FRAMES];
    int setups; /* frames[0..setups-1] are set-up frames, frames[setups] the request */
    int have_request;
    frame_t request;
    patch_t patches[MAX_PATCHES];
    int npatches;
    capture_t captures[MAX_CAPTURES];
    int ncaptures;
    int key_offset[2], key_width[2], key_fields;
    int block_start, block_length, check_blocks;
    int retry_code, retry_ms;
    int pids[MAX_PIDS], npids;
} opt = {.connections = 16, .in_flight = 1, .seconds = 3.0, .spread = 1.0, .deadline = 120.0,
         .retry_code = -32768};

static unsigned char *from_hex(const char *hex, size_t *size) {
    size_t n = strlen(hex);
    if (n % 2) die("odd hex length");
    unsigned char *out = malloc(n / 2);
    for (size_t i = 0; i < n / 2; i++) {
        unsigned int byte;
        if (sscanf(hex + 2 * i, "%2x", &byte) != 1) die("bad hex at %zu", 2 * i);
        out[i] = (unsigned char)byte;
    }
    *size = n / 2;
    return out;
}

static frame_t parse_frame(const char *arg) {
    frame_t f;
    int consumed = 0;
    if (sscanf(arg, "%d:%d:%n", &f.response_header, &f.error_at, &consumed) != 2 || !consumed)
        die("a frame is RH:ERR:HEX, not %s", arg);
    if (f.response_header != 0 && f.response_header != 1) die("response header 0 or 1");
    f.bytes = from_hex(arg + consumed, &f.size);
    if (f.size < 12) die("a request frame has at least 12 bytes");
    uint32_t length = ntohl(*(uint32_t *)f.bytes);
    if (length != f.size - 4) die("frame length prefix %u, but %zu bytes follow", length, f.size - 4);
    return f;
}

static int frame_index(const char *text) {
    if (!strcmp(text, "r")) return -1;
    return atoi(text);
}

static void parse_args(int argc, char **argv) {
    if (argc < 2) die("usage: loadgen HOST:PORT [options] --request RH:ERR:HEX");
    char *address = strdup(argv[1]);
    char *colon = strrchr(address, ':');
    if (!colon) die("HOST:PORT, not %s", argv[1]);
    *colon = 0;
    opt.host = address;
    opt.port = colon + 1;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--storm")) { opt.storm = 1; continue; }
        if (!v) die("%s needs a value", a);
        i++;
        if (!strcmp(a, "--connections")) opt.connections = atoi(v);
        else if (!strcmp(a, "--in-flight")) opt.in_flight = atoi(v);
        else if (!strcmp(a, "--seconds")) opt.seconds = atof(v);
        else if (!strcmp(a, "--spread")) opt.spread = atof(v);
        else if (!strcmp(a, "--deadline")) opt.deadline = atof(v);
        else if (!strcmp(a, "--setup")) {
            if (opt.setups == MAX_FRAMES - 1) die("too many set-up frames");
            opt.frames[opt.setups++] = parse_frame(v);
        } else if (!strcmp(a, "--request")) {
            opt.request = parse_frame(v);
            opt.have_request = 1;
        } else if (!strcmp(a, "--patch")) {
            if (opt.npatches == MAX_PATCHES) die("too many patches");
            patch_t *p = &opt.patches[opt.npatches++];
            char which[16], kind[8] = "";
            if (sscanf(v, "%15[^:]:%d:%d:%lld:%7s", which, &p->offset, &p->width, &p->base, kind) < 4)
                die("--patch FRAME:OFFSET:WIDTH:BASE[:dec], not %s", v);
            p->frame = frame_index(which);
            p->decimal = !strcmp(kind, "dec");
            if (!p->decimal && (p->width < 1 || p->width > 8)) die("an integer patch is 1-8 bytes");
        } else if (!strcmp(a, "--capture")) {
            if (opt.ncaptures == MAX_CAPTURES) die("too many captures");
            capture_t *c = &opt.captures[opt.ncaptures++];
            char to[16];
            if (sscanf(v, "%d:%d:%d:%15[^:]:%d", &c->from, &c->body_offset, &c->width, to, &c->offset) != 5)
                die("--capture FROM:BODYOFF:WIDTH:TO:OFFSET, not %s", v);
            c->to = frame_index(to);
        } else if (!strcmp(a, "--unique-key")) {
            opt.key_fields = sscanf(v, "%d:%d,%d:%d", &opt.key_offset[0], &opt.key_width[0],
                                    &opt.key_offset[1], &opt.key_width[1]) / 2;
            if (opt.key_fields < 1 || opt.key_width[0] > 8 || (opt.key_fields == 2 && opt.key_width[1] > 8))
                die("--unique-key BODYOFF:WIDTH[,BODYOFF:WIDTH] (widths up to 8), not %s", v);
        } else if (!strcmp(a, "--unique-blocks")) {
            if (sscanf(v, "%d:%d", &opt.block_start, &opt.block_length) != 2) die("--unique-blocks START:LEN");
            opt.check_blocks = 1;
        } else if (!strcmp(a, "--retry")) {
            if (sscanf(v, "%d:%d", &opt.retry_code, &opt.retry_ms) != 2) die("--retry CODE:MS");
        } else if (!strcmp(a, "--pid")) {
            if (opt.npids == MAX_PIDS) die("too many --pid");
            opt.pids[opt.npids++] = atoi(v);
        } else die("unknown option %s", a);
    }
    if (!opt.have_request) die("--request is required");
    if (opt.connections < 1 || opt.in_flight < 1) die("--connections and --in-flight are >= 1");
    if (opt.storm) opt.in_flight = 1;
    opt.frames[opt.setups] = opt.request;
    for (int i = 0; i < opt.npatches; i++) {
        patch_t *p = &opt.patches[i];
        if (p->frame < 0) p->frame = opt.setups;
        if (p->frame > opt.setups || p->offset < 12 ||
            (size_t)(p->offset + p->width) > opt.frames[p->frame].size)
            die("patch %d lies outside its frame (or on its header)", i);
    }
    for (int i = 0; i < opt.ncaptures; i++) {
        capture_t *c = &opt.captures[i];
        if (c->to < 0) c->to = opt.setups;
        if (c->from >= opt.setups || c->to <= c->from || c->width < 1 ||
            (size_t)(c->offset + c->width) > opt.frames[c->to].size || c->offset < 12)
            die("capture %d must copy from a set-up frame's answer into a later frame", i);
    }
}

/* -- connections ------------------------------------------------------------------------------ */

enum state { IDLE, CONNECTING, SETUP, READY, LOAD, WAITING_RETRY, DONE };

typedef struct {
    int fd;
    enum state state;
    int step;                 /* the set-up frame in flight (SETUP) */
    unsigned char *frames[MAX_FRAMES];
    int32_t next_correlation;
    /* Requests in flight, oldest first: correlation id and when sent. */
    int32_t *correlations;
    uint64_t *sent_ns;
    int head, outstanding;
    unsigned char *in;
    size_t in_size, in_capacity;
    unsigned char *out;
    size_t out_size, out_capacity;
    int want_write;
    int pending_retries;      /* its requests waiting in the retry queue */
} conn_t;

/* A request to send again (or, in a storm, a connection to open again): which connection's,
 * and when. */
typedef struct {
    int index;
    uint64_t at_ns;
    int reconnect;
} retry_t;

static conn_t *conns;
static int epfd;
static struct sockaddr_storage server;
static socklen_t server_size;
static uint64_t answers, retries, reconnects, bytes_read;
static uint64_t *keys; /* unique-key mode: two words per answer */
static size_t nkeys, keys_capacity;
static double *served_s; /* storm: when each connection was served */
static int served;
static int ready, done;
/* Requests waiting to be sent again, in arrival order (every one waits the same time, so the
 * queue stays sorted by when to retry); a ring of retry_slots entries. In load mode a server
 * that answers the retriable code (Kafka's broker while it waits for a PID block) has the
 * request sent again after the same delay, as a client would. */
static retry_t *retry_queue;
static int retry_head, retry_tail, retry_slots;
static int loading;      /* the timed window has begun */
static uint64_t stop_sending_ns;
static uint64_t window_start_ns;

static void resolve(void) {
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res;
    int rc = getaddrinfo(opt.host, opt.port, &hints, &res);
    if (rc) die("cannot resolve %s:%s: %s", opt.host, opt.port, gai_strerror(rc));
    memcpy(&server, res->ai_addr, res->ai_addrlen);
    server_size = res->ai_addrlen;
    freeaddrinfo(res);
}

static void put_int(unsigned char *at, int width, unsigned long long value) {
    for (int i = width - 1; i >= 0; i--, value >>= 8) at[i] = (unsigned char)(value & 0xff);
}

static unsigned long long get_int(const unsigned char *at, int width) {
    unsigned long long v = 0;
    for (int i = 0; i < width; i++) v = v << 8 | at[i];
    return v;
}

static void prepare(conn_t *c, int index) {
    memset(c, 0, sizeof *c);
    c->fd = -1;
    for (int f = 0; f <= opt.setups; f++) {
        c->frames[f] = malloc(opt.frames[f].size);
        memcpy(c->frames[f], opt.frames[f].bytes, opt.frames[f].size);
    }
    for (int i = 0; i < opt.npatches; i++) {
        patch_t *p = &opt.patches[i];
        unsigned char *at = c->frames[p->frame] + p->offset;
        long long value = p->base + index;
        if (p->decimal) {
            char digits[32];
            int n = snprintf(digits, sizeof digits, "%0*lld", p->width, value);
            if (n != p->width) die("connection %d: %lld does not fit %d digits", index, value, p->width);
            memcpy(at, digits, (size_t)p->width);
        } else {
            put_int(at, p->width, (unsigned long long)value);
        }
    }
    int slots = opt.in_flight + 1;
    c->correlations = malloc(sizeof(int32_t) * (size_t)slots);
    c->sent_ns = malloc(sizeof(uint64_t) * (size_t)slots);
    c->in_capacity = READ_BYTES;
    c->in = malloc(c->in_capacity);
    c->out_capacity = 4096;
    c->out = malloc(c->out_capacity);
}

static void watch(conn_t *c, int index, int writable) {
    struct epoll_event ev = {.events = EPOLLIN | (writable ? EPOLLOUT : 0), .data.u32 = (uint32_t)index};
    if (epoll_ctl(epfd, EPOLL_CTL_MOD, c->fd, &ev)) die("epoll_ctl: %s", strerror(errno));
    c->want_write = writable;
}

static void start(conn_t *c, int index) {
    c->fd = socket(server.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c->fd < 0) die("socket: %s (connection %d)", strerror(errno), index);
    int one = 1;
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(c->fd, (struct sockaddr *)&server, server_size) && errno != EINPROGRESS)
        die("connect: %s (connection %d)", strerror(errno), index);
    c->state = CONNECTING;
    struct epoll_event ev = {.events = EPOLLOUT, .data.u32 = (uint32_t)index};
    if (epoll_ctl(epfd, EPOLL_CTL_ADD, c->fd, &ev)) die("epoll_ctl: %s", strerror(errno));
}

/* A storm's producer whose connection the server reset or closed before serving it connects
 * again after --retry's delay, from the start (ApiVersions first), as a client does (Kafka's
 * clients after reconnect.backoff.ms, 50 ms). In load mode the run fails instead. */
static void reconnect_later(conn_t *c, int index, const char *what, int error) {
    if (!opt.storm) die("connection %d: %s%s%s", index, what, error ? ": " : "", error ? strerror(error) : "");
    close(c->fd); /* also leaves the epoll set */
    c->fd = -1;
    c->state = WAITING_RETRY;
    c->head = c->outstanding = c->step = c->want_write = 0;
    c->in_size = c->out_size = 0;
    reconnects++;
    c->pending_retries++;
    retry_queue[retry_tail] = (retry_t){index, now_ns() + (uint64_t)opt.retry_ms * 1000000u, 1};
    retry_tail = (retry_tail + 1) % retry_slots;
}

static int is_reset(int error) { return error == ECONNRESET || error == EPIPE || error == ECONNREFUSED; }

static void flush(conn_t *c, int index) {
    size_t written = 0;
    while (written < c->out_size) {
        ssize_t n = write(c->fd, c->out + written, c->out_size - written);
        if (n < 0) {
            if (errno == EAGAIN) break;
            if (!is_reset(errno)) die("connection %d: write: %s", index, strerror(errno));
            reconnect_later(c, index, "write", errno);
            return;
        }
        written += (size_t)n;
    }
    memmove(c->out, c->out + written, c->out_size - written);
    c->out_size -= written;
    if ((c->out_size > 0) != c->want_write) watch(c, index, c->out_size > 0);
}

/* Queue frame f with the next correlation id; sent at `when`. */
static void send_frame(conn_t *c, int f, uint64_t when) {
    size_t size = opt.frames[f].size;
    if (c->out_size + size > c->out_capacity) {
        while (c->out_size + size > c->out_capacity) c->out_capacity *= 2;
        c->out = realloc(c->out, c->out_capacity);
    }
    int32_t correlation = c->next_correlation;
    c->next_correlation = correlation == INT32_MAX ? 0 : correlation + 1;
    put_int(c->frames[f] + 8, 4, (uint32_t)correlation);
    memcpy(c->out + c->out_size, c->frames[f], size);
    c->out_size += size;
    int slots = opt.in_flight + 1;
    int tail = (c->head + c->outstanding) % slots;
    c->correlations[tail] = correlation;
    c->sent_ns[tail] = when;
    c->outstanding++;
}

static void add_key(const unsigned char *body, size_t size, int index) {
    uint64_t k[2] = {0, 0};
    for (int i = 0; i < opt.key_fields; i++) {
        if ((size_t)(opt.key_offset[i] + opt.key_width[i]) > size) die("connection %d: answer too short for its key", index);
        k[i] = get_int(body + opt.key_offset[i], opt.key_width[i]);
    }
    if (nkeys == keys_capacity) {
        keys_capacity = keys_capacity ? keys_capacity * 2 : 65536;
        keys = realloc(keys, keys_capacity * 2 * sizeof(uint64_t));
    }
    keys[2 * nkeys] = k[0];
    keys[2 * nkeys + 1] = k[1];
    nkeys++;
}

static void add_block(const unsigned char *body, size_t size, int index) {
    if ((size_t)opt.block_start + 8 > size || (size_t)opt.block_length + 4 > size)
        die("connection %d: answer too short for its block", index);
    if (nkeys == keys_capacity) {
        keys_capacity = keys_capacity ? keys_capacity * 2 : 65536;
        keys = realloc(keys, keys_capacity * 2 * sizeof(uint64_t));
    }
    keys[2 * nkeys] = get_int(body + opt.block_start, 8);
    keys[2 * nkeys + 1] = get_int(body + opt.block_length, 4);
    nkeys++;
}

static int compare_keys(const void *a, const void *b) {
    const uint64_t *x = a, *y = b;
    if (x[0] != y[0]) return x[0] < y[0] ? -1 : 1;
    if (x[1] != y[1]) return x[1] < y[1] ? -1 : 1;
    return 0;
}

static void check_keys(void) {
    if (!nkeys) return;
    qsort(keys, nkeys, 2 * sizeof(uint64_t), compare_keys);
    for (size_t i = 1; i < nkeys; i++) {
        uint64_t *a = keys + 2 * (i - 1), *b = keys + 2 * i;
        if (opt.check_blocks) {
            if (a[0] + a[1] > b[0])
                die("blocks at %llu and %llu overlap", (unsigned long long)a[0], (unsigned long long)b[0]);
        } else if (!compare_keys(a, b)) {
            die("handed out twice: %llu, %llu", (unsigned long long)a[0], (unsigned long long)a[1]);
        }
    }
}

static void begin_window(void);

/* One whole answer frame (without its length prefix) on connection c. */
static void answer(conn_t *c, int index, const unsigned char *frame, size_t size, uint64_t at) {
    if (!c->outstanding) die("connection %d: an answer to no request", index);
    if (size < 4) die("connection %d: an answer of %zu bytes", index, size);
    int slots = opt.in_flight + 1;
    int32_t expected = c->correlations[c->head];
    uint64_t sent = c->sent_ns[c->head];
    c->head = (c->head + 1) % slots;
    c->outstanding--;
    int32_t correlation = (int32_t)get_int(frame, 4);
    if (correlation != expected)
        die("connection %d: answer with correlation id %d while %d was expected", index, correlation, expected);
    int f = c->state == SETUP ? c->step : opt.setups;
    size_t body = 4;
    if (opt.frames[f].response_header == 1) {
        /* Tagged fields: an unsigned varint count, then (tag, size, bytes) each. */
        unsigned long long count = 0;
        int shift = 0;
        while (body < size) {
            unsigned char b = frame[body++];
            count |= (unsigned long long)(b & 0x7f) << shift;
            shift += 7;
            if (!(b & 0x80)) break;
        }
        for (unsigned long long t = 0; t < count; t++) {
            for (int field = 0; field < 2; field++) {
                unsigned long long v = 0;
                shift = 0;
                while (body < size) {
                    unsigned char b = frame[body++];
                    v |= (unsigned long long)(b & 0x7f) << shift;
                    shift += 7;
                    if (!(b & 0x80)) break;
                }
                if (field == 1) body += v;
            }
        }
        if (body > size) die("connection %d: truncated response header", index);
    }
    const unsigned char *payload = frame + body;
    size_t payload_size = size - body;
    int error = 0;
    if (opt.frames[f].error_at >= 0) {
        if ((size_t)opt.frames[f].error_at + 2 > payload_size) die("connection %d: answer too short", index);
        error = (int16_t)get_int(payload + opt.frames[f].error_at, 2);
    }
    if (c->state == SETUP) {
        if (error) die("connection %d: set-up frame %d answered with error %d", index, c->step, error);
        for (int i = 0; i < opt.ncaptures; i++) {
            capture_t *cap = &opt.captures[i];
            if (cap->from != c->step) continue;
            if ((size_t)(cap->body_offset + cap->width) > payload_size) die("connection %d: capture outside the answer", index);
            memcpy(c->frames[cap->to] + cap->offset, payload + cap->body_offset, (size_t)cap->width);
        }
        if (++c->step < opt.setups) {
            send_frame(c, c->step, at);
        } else if (opt.storm) {
            c->state = LOAD;
            send_frame(c, opt.setups, at);
        } else {
            c->state = READY;
            if (++ready == opt.connections) begin_window();
        }
        return;
    }
    if (error && error == opt.retry_code) {
        retries++;
        c->state = WAITING_RETRY;
        c->pending_retries++;
        retry_queue[retry_tail] = (retry_t){index, at + (uint64_t)opt.retry_ms * 1000000u, 0};
        retry_tail = (retry_tail + 1) % retry_slots;
        return;
    }
    if (error) die("connection %d: answered with error %d", index, error);
    answers++;
    record(at - sent);
    if (opt.key_fields) add_key(payload, payload_size, index);
    if (opt.check_blocks) add_block(payload, payload_size, index);
    if (opt.storm) {
        served_s[index] = (double)(at - window_start_ns) * 1e-9;
        served++;
        c->state = DONE;
        done++;
        return;
    }
    if (at < stop_sending_ns) send_frame(c, opt.setups, at);
    else if (!c->outstanding && !c->pending_retries) { c->state = DONE; done++; }
}

/* Send again every request whose retry is due at t (after the stop, in load mode, none:
 * the connection is done once nothing of it is outstanding). */
static void send_retries(uint64_t t) {
    while (retry_head != retry_tail && retry_queue[retry_head].at_ns <= t) {
        int i = retry_queue[retry_head].index, reconnect = retry_queue[retry_head].reconnect;
        retry_head = (retry_head + 1) % retry_slots;
        conn_t *c = &conns[i];
        c->pending_retries--;
        if (reconnect) {
            start(c, i);
            continue;
        }
        c->state = LOAD;
        if (!opt.storm && t >= stop_sending_ns) {
            if (!c->outstanding && !c->pending_retries) { c->state = DONE; done++; }
            continue;
        }
        send_frame(c, opt.setups, t);
        flush(c, i);
    }
}

static void readable(conn_t *c, int index) {
    for (;;) {
        if (c->in_capacity - c->in_size < READ_BYTES) {
            c->in_capacity = c->in_size + READ_BYTES;
            c->in = realloc(c->in, c->in_capacity);
        }
        size_t space = c->in_capacity - c->in_size;
        ssize_t n = read(c->fd, c->in + c->in_size, space);
        if (n < 0) {
            if (errno == EAGAIN) break;
            if (!is_reset(errno)) die("connection %d: read: %s", index, strerror(errno));
            reconnect_later(c, index, "read", errno);
            return;
        }
        if (n == 0) {
            reconnect_later(c, index, "the server closed the connection", 0);
            return;
        }
        bytes_read += (uint64_t)n;
        c->in_size += (size_t)n;
        uint64_t at = now_ns();
        size_t start = 0;
        while (c->in_size - start >= 4 && c->state != DONE) {
            uint32_t length = (uint32_t)get_int(c->in + start, 4);
            if (length > 64u * 1024 * 1024) die("connection %d: answer of %u bytes", index, length);
            if (c->in_size - start - 4 < length) break;
            answer(c, index, c->in + start + 4, length, at);
            start += 4 + length;
        }
        memmove(c->in, c->in + start, c->in_size - start);
        c->in_size -= start;
        if (c->state == DONE && opt.storm) {
            close(c->fd); /* also leaves the epoll set */
            c->fd = -1;
            return;
        }
        if ((size_t)n < space) break; /* the socket is drained */
    }
    if (c->out_size) flush(c, index);
}

static void connected(conn_t *c, int index) {
    int error = 0;
    socklen_t size = sizeof error;
    getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &error, &size);
    if (error) {
        if (!is_reset(error)) die("connection %d: connect: %s", index, strerror(error));
        reconnect_later(c, index, "connect", error);
        return;
    }
    uint64_t at = now_ns();
    if (opt.setups) {
        c->state = SETUP;
        c->step = 0;
        send_frame(c, 0, at);
    } else if (opt.storm) {
        c->state = LOAD;
        send_frame(c, opt.setups, at);
    } else {
        c->state = READY;
        if (++ready == opt.connections) begin_window();
    }
    watch(c, index, 0);
    if (c->out_size) flush(c, index);
}

/* -- CPU time ------------------------------------------------------------------------------------ */

static double process_cpu_s(int pid) {
    char path[64], text[4096];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) die("cannot read %s: %s", path, strerror(errno));
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = 0;
    /* After the command's closing parenthesis: state is field 3; utime, stime are 14, 15. */
    char *p = strrchr(text, ')');
    if (!p) die("unexpected %s", path);
    unsigned long long utime = 0, stime = 0;
    if (sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &utime, &stime) != 2)
        die("unexpected %s", path);
    return (double)(utime + stime) / (double)sysconf(_SC_CLK_TCK);
}

static double self_cpu_s(void) {
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return (double)u.ru_utime.tv_sec + (double)u.ru_utime.tv_usec * 1e-6 + (double)u.ru_stime.tv_sec +
           (double)u.ru_stime.tv_usec * 1e-6;
}

/* How long a process's threads were runnable but waiting for a CPU (the scheduler's run-queue
 * delay: the second field of /proc/PID/task/TID/schedstat, in ns), in seconds. On a machine
 * shared with other work this is the time the machine, not the process, held it back. */
static double runqueue_s(const char *pid) {
    char path[96];
    snprintf(path, sizeof path, "/proc/%s/task", pid);
    DIR *tasks = opendir(path);
    if (!tasks) return 0.0; /* no schedstat here: reported as 0 */
    double total = 0.0;
    struct dirent *task;
    while ((task = readdir(tasks))) {
        if (task->d_name[0] == '.') continue;
        snprintf(path, sizeof path, "/proc/%s/task/%.32s/schedstat", pid, task->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue; /* the thread ended meanwhile */
        unsigned long long on_cpu, waiting;
        if (fscanf(f, "%llu %llu", &on_cpu, &waiting) == 2) total += (double)waiting * 1e-9;
        fclose(f);
    }
    closedir(tasks);
    return total;
}

/* The machine's CPU time in seconds since boot, all CPUs: busy (not idle, iowait or
 * steal) and stolen by the hypervisor (/proc/stat's first line). */
static void machine_cpu_s(double *busy, double *steal) {
    unsigned long long v[8] = {0};
    FILE *f = fopen("/proc/stat", "r");
    if (!f || fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4],
                     &v[5], &v[6], &v[7]) != 8)
        die("cannot read /proc/stat");
    fclose(f);
    double tick = (double)sysconf(_SC_CLK_TCK);
    *busy = (double)(v[0] + v[1] + v[2] + v[5] + v[6]) / tick; /* user nice system irq softirq */
    *steal = (double)v[7] / tick;
}

static double cpu_start[MAX_PIDS], self_start;
static double runqueue_start[MAX_PIDS], self_runqueue_start, machine_busy_start, machine_steal_start;

static void pid_text(int pid, char *text, size_t size) { snprintf(text, size, "%d", pid); }

/* The costs over the measured window begin now: every --pid's CPU time and run-queue delay,
 * the generator's own, the machine's. */
static void start_costing(void) {
    char pid[16];
    for (int i = 0; i < opt.npids; i++) {
        cpu_start[i] = process_cpu_s(opt.pids[i]);
        pid_text(opt.pids[i], pid, sizeof pid);
        runqueue_start[i] = runqueue_s(pid);
    }
    self_start = self_cpu_s();
    self_runqueue_start = runqueue_s("self");
    machine_cpu_s(&machine_busy_start, &machine_steal_start);
}

static void begin_window(void) {
    loading = 1;
    start_costing();
    window_start_ns = now_ns();
    stop_sending_ns = window_start_ns + (uint64_t)(opt.seconds * 1e9);
    for (int i = 0; i < opt.connections; i++) {
        conn_t *c = &conns[i];
        c->state = LOAD;
        for (int k = 0; k < opt.in_flight; k++) send_frame(c, opt.setups, window_start_ns);
        flush(c, i);
    }
}

/* -- output ------------------------------------------------------------------------------------- */

static int compare_doubles(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void report(double elapsed) {
    double self = self_cpu_s() - self_start;
    double self_waiting = runqueue_s("self") - self_runqueue_start;
    double machine_busy, machine_steal;
    machine_cpu_s(&machine_busy, &machine_steal);
    double per_s = elapsed > 0 ? 1.0 / elapsed : 0.0;
    printf("{\"connections\": %d, \"in_flight\": %d, \"seconds\": %.6f, \"requests\": %llu, "
           "\"per_second\": %.3f, \"retries\": %llu, \"reconnects\": %llu, \"bytes_read\": %llu, ",
           opt.connections, opt.in_flight, elapsed, (unsigned long long)answers,
           elapsed > 0 ? (double)answers / elapsed : 0.0, (unsigned long long)retries,
           (unsigned long long)reconnects,
           (unsigned long long)bytes_read);
    printf("\"p50_ms\": %.4f, \"p90_ms\": %.4f, \"p99_ms\": %.4f, \"p999_ms\": %.4f, "
           "\"max_ms\": %.4f, \"mean_ms\": %.4f, ",
           percentile_ms(0.50), percentile_ms(0.90), percentile_ms(0.99), percentile_ms(0.999),
           (double)histogram_max / 1e6, histogram_count ? histogram_sum / (double)histogram_count / 1e6 : 0.0);
    /* busy share: on a CPU or waiting for one; the rest of the window it slept in epoll_wait,
     * every request of every connection outstanding (closed loop): waiting for the server. */
    printf("\"client_cpu_s\": %.4f, \"client_cpu_share\": %.4f, \"client_runqueue_s\": %.4f, "
           "\"client_busy_share\": %.4f, \"machine_busy_cores\": %.4f, \"machine_steal_cores\": %.4f, "
           "\"unique_checked\": %zu, \"servers\": [",
           self, self * per_s, self_waiting, (self + self_waiting) * per_s,
           (machine_busy - machine_busy_start) * per_s, (machine_steal - machine_steal_start) * per_s, nkeys);
    for (int i = 0; i < opt.npids; i++) {
        char pid[16];
        pid_text(opt.pids[i], pid, sizeof pid);
        double used = process_cpu_s(opt.pids[i]) - cpu_start[i];
        double waiting = runqueue_s(pid) - runqueue_start[i];
        printf("%s{\"pid\": %d, \"cpu_s\": %.4f, \"cpu_share\": %.4f, \"runqueue_s\": %.4f}", i ? ", " : "",
               opt.pids[i], used, used * per_s, waiting);
    }
    printf("], \"histogram_us\": [");
    /* Coarse: answers per power of two of microseconds (upper bound, count). */
    uint64_t coarse[64] = {0};
    for (int i = 0; i < BUCKETS; i++)
        if (histogram[i]) {
            uint64_t us = (uint64_t)(bucket_middle(i) / 1000.0);
            coarse[us ? 64 - __builtin_clzll(us) : 0] += histogram[i];
        }
    int first = 1;
    for (int i = 0; i < 64; i++)
        if (coarse[i]) {
            printf("%s[%llu, %llu]", first ? "" : ", ", 1ull << i, (unsigned long long)coarse[i]);
            first = 0;
        }
    printf("]");
    if (opt.storm) {
        qsort(served_s, (size_t)served, sizeof(double), compare_doubles);
        printf(", \"producers\": %d, \"served\": %d, \"last_served_s\": %.4f, \"p50_s\": %.4f, "
               "\"p99_s\": %.4f, \"curve\": [",
               opt.connections, served, served_s[served - 1], served_s[served / 2],
               served_s[(int)(0.99 * (served - 1))]);
        for (int i = 0; i <= 20; i++) {
            int at = (int)((double)i / 20.0 * served + 0.5);
            if (at > served - 1) at = served - 1;
            printf("%s[%.4f, %.2f]", i ? ", " : "", served_s[at], (double)i / 20.0);
        }
        printf("]");
    }
    printf("}\n");
}

/* -- the loop ------------------------------------------------------------------------------------- */

int main(int argc, char **argv) {
    parse_args(argc, argv);
    resolve();
    signal(SIGPIPE, SIG_IGN); /* a write to a reset connection fails with EPIPE instead */
    struct rlimit files;
    if (!getrlimit(RLIMIT_NOFILE, &files)) {
        files.rlim_cur = files.rlim_max;
        setrlimit(RLIMIT_NOFILE, &files);
        if ((rlim_t)opt.connections + 16 > files.rlim_cur)
            die("%d connections, but at most %llu open files", opt.connections, (unsigned long long)files.rlim_cur);
    }
    epfd = epoll_create1(EPOLL_CLOEXEC);
    conns = calloc((size_t)opt.connections, sizeof(conn_t));
    for (int i = 0; i < opt.connections; i++) prepare(&conns[i], i);
    struct epoll_event events[EVENTS];
    int started = 0;
    retry_slots = opt.connections * opt.in_flight + 1;
    retry_queue = malloc(sizeof(retry_t) * (size_t)retry_slots);
    double deadline = now_s() + opt.deadline;
    if (opt.storm) {
        served_s = calloc((size_t)opt.connections, sizeof(double));
        loading = 1;
        start_costing();
        window_start_ns = now_ns();
    } else {
        for (; started < opt.connections; started++) start(&conns[started], started);
    }
    while (done < opt.connections) {
        uint64_t t = now_ns();
        if (opt.storm) {
            double since = (double)(t - window_start_ns) * 1e-9;
            while (started < opt.connections && since >= opt.spread * started / opt.connections) {
                start(&conns[started], started);
                started++;
            }
        }
        send_retries(t);
        if (now_s() > deadline) die("not done within --deadline %.0f s (%d of %d done)", opt.deadline, done, opt.connections);
        /* Wait at most until the next connection is due, the next retry, or the stop. */
        uint64_t wake = now_ns() + 100000000u;
        if (opt.storm && started < opt.connections) {
            uint64_t next = window_start_ns + (uint64_t)(opt.spread * 1e9 * started / opt.connections);
            if (next < wake) wake = next;
        }
        if (retry_head != retry_tail && retry_queue[retry_head].at_ns < wake)
            wake = retry_queue[retry_head].at_ns;
        if (loading && !opt.storm && stop_sending_ns > now_ns() && stop_sending_ns < wake) wake = stop_sending_ns;
        int64_t wait_ns = (int64_t)(wake - now_ns());
        /* Whole milliseconds, rounded up: connections due meanwhile start together. */
        int timeout = wait_ns > 0 ? (int)((wait_ns + 999999) / 1000000) : 0;
        int n = epoll_wait(epfd, events, EVENTS, timeout);
        if (n < 0) {
            if (errno == EINTR) continue;
            die("epoll_wait: %s", strerror(errno));
        }
        for (int e = 0; e < n; e++) {
            int i = (int)events[e].data.u32;
            conn_t *c = &conns[i];
            if (c->fd < 0) continue;
            if (c->state == CONNECTING) {
                connected(c, i);
                continue;
            }
            if (events[e].events & (EPOLLIN | EPOLLERR | EPOLLHUP)) readable(c, i);
            if (c->fd >= 0 && (events[e].events & EPOLLOUT) && c->out_size) flush(c, i);
        }
        if (loading && !opt.storm && now_ns() >= stop_sending_ns) {
            /* Connections with nothing outstanding after the stop are done. */
            for (int i = 0; i < opt.connections; i++)
                if (conns[i].state == LOAD && !conns[i].outstanding && !conns[i].pending_retries) {
                    conns[i].state = DONE;
                    done++;
                }
        }
    }
    double elapsed = (double)(now_ns() - window_start_ns) * 1e-9;
    check_keys();
    report(elapsed);
    return 0;
}
