/*
 * batchwire — public C API of libbatchwire.
 *
 * Everything a program may rely on is declared under include/batchwire/; nothing else is
 * exported from the shared library.
 *
 * Threads -- the one rule for the whole API:
 *   - Functions that take no loader may be called from any thread, concurrently: bw_version,
 *     bw_build_info, bw_strerror, bw_err_name, bw_loader_options_init_sized, bw_loader_open,
 *     bw_loader_open_at, bw_loader_open_elastic, bw_loader_rank_steps, bw_job_checkpoint and
 *     bw_cursor_describe (each call uses only its own arguments).
 *   - A loader, and the batches and error message it hands out, is used by one thread at a
 *     time: calls on one loader must not overlap (a caller that moves a loader between threads
 *     serialises the calls itself). The loader runs its own fetch threads inside. Different
 *     loaders are independent.
 *   - Exceptions, callable from any thread while the loader's own thread uses it (but not
 *     during or after bw_loader_close): bw_loader_get_stats and bw_loader_lease_state (they
 *     read atomics). A hold (bw_hold_data, bw_hold_nbytes, bw_hold_release) belongs to no
 *     loader: any thread, also after bw_loader_close, one thread per hold reference.
 *   - Process-wide: bw_interrupt, bw_interrupt_clear and bw_interrupted are any thread and
 *     async-signal-safe; bw_interrupt_on_signals is any thread (installing is serialised
 *     inside). bw_set_log_callback is a set-up call: make it before opening loaders, not
 *     concurrently with other library calls. The log callback itself is called from any of
 *     the library's threads.
 */
#ifndef BATCHWIRE_BATCHWIRE_H
#define BATCHWIRE_BATCHWIRE_H

#ifdef __cplusplus
extern "C" {
#endif

#if defined(BW_BUILDING_LIBRARY)
#define BW_EXTERN __attribute__((visibility("default")))
#else
#define BW_EXTERN
#endif

#define BW_VERSION_MAJOR 0
#define BW_VERSION_MINOR 1
#define BW_VERSION_PATCH 0

/* Returns the library version as "MAJOR.MINOR.PATCH"; a static string. */
BW_EXTERN const char *bw_version(void);

/*
 * What this build of the library is, one line of a static string:
 *     "0.1.0 commit=2bfd0fe1a2b3-dirty build=RelWithDebInfo tls=yes cuda=no"
 * the version, the source's commit at build time (`git describe --always --dirty`, or
 * "unknown"), the CMake build type, and whether TLS and the CUDA copy path are built in
 * (" sanitize=..." follows for sanitizer builds). Every program's --version prints it.
 */
BW_EXTERN const char *bw_build_info(void);

/*
 * Error codes. Numbers are stable: a retired number is never reused. Functions return
 * BW_OK (0) or a negative code; a sentence for people travels separately (see each API).
 *
 * X(name, number, grpc_status, message). grpc_status follows gRPC's rule: UNAVAILABLE means
 * retry the call, ABORTED retry higher up, FAILED_PRECONDITION do not retry.
 */
#define BW_ERR_MAP(X)                                                                              \
    X(OK, 0, OK, "success")                                                                        \
    X(INVALID_ARGUMENT, -1, INVALID_ARGUMENT, "invalid argument")                                  \
    X(NOMEM, -2, RESOURCE_EXHAUSTED, "out of memory")                                              \
    X(IO, -3, INTERNAL, "input/output error")                                                      \
    X(NOT_FOUND, -4, NOT_FOUND, "not found")                                                       \
    X(ALREADY_EXISTS, -5, ALREADY_EXISTS, "already exists")                                        \
    X(PERMISSION_DENIED, -6, PERMISSION_DENIED, "permission denied")                               \
    X(UNAVAILABLE, -7, UNAVAILABLE, "service unavailable")                                         \
    X(TIMEOUT, -8, DEADLINE_EXCEEDED, "deadline exceeded")                                         \
    X(TOO_BIG, -9, RESOURCE_EXHAUSTED, "size limit exceeded")                                      \
    X(CORRUPT, -10, DATA_LOSS, "corrupt data")                                                     \
    X(PROTOCOL, -11, INTERNAL, "protocol error")                                                   \
    X(UNIMPLEMENTED, -12, UNIMPLEMENTED, "not implemented")                                        \
    X(FAILED_PRECONDITION, -13, FAILED_PRECONDITION, "failed precondition")                        \
    X(ABORTED, -14, ABORTED, "aborted; retry from a higher level")                                 \
    X(OUT_OF_RANGE, -15, OUT_OF_RANGE, "out of range")                                             \
    X(CANCELLED, -16, CANCELLED, "cancelled")                                                      \
    X(TLS, -17, UNAVAILABLE, "TLS setup failed")                                                   \
    X(UNAUTHENTICATED, -18, UNAUTHENTICATED, "not authenticated")                                  \
    X(WRONG_OWNER, -19, FAILED_PRECONDITION, "placement changed: refresh placement")               \
    X(MISMATCH, -20, FAILED_PRECONDITION, "configuration or fingerprint mismatch")                 \
    X(NO_DEVICE, -21, FAILED_PRECONDITION, "no GPU device available")                              \
    X(END_OF_EPOCH, -22, OUT_OF_RANGE, "end of epoch")                                             \
    X(INTERNAL, -23, INTERNAL, "internal error")                                                   \
    X(BUSY, -24, RESOURCE_EXHAUSTED,                                                               \
      "server busy: over its in-flight budget, retry after a pause")                               \
    X(LEASE_LOST, -25, FAILED_PRECONDITION,                                                        \
      "this rank's lease was lost: another process holds it")                                      \
    X(INTERRUPTED, -26, CANCELLED, "interrupted by a signal (bw_interrupt)")

typedef enum bw_err {
#define BW__ERR_ENUM(name, num, grpc, msg) BW_##name = (num),
    BW_ERR_MAP(BW__ERR_ENUM)
#undef BW__ERR_ENUM
} bw_err;

/* A static sentence describing `rc`, e.g. "deadline exceeded"; never NULL. */
BW_EXTERN const char *bw_strerror(int rc);

/* The code's stable name, e.g. "BW_TIMEOUT"; "BW_UNKNOWN_ERROR" for numbers not in the list. */
BW_EXTERN const char *bw_err_name(int rc);

/* Log levels, most severe first. */
typedef enum bw_log_level {
    BW_LOG_ERROR = 0,
    BW_LOG_WARN = 1,
    BW_LOG_INFO = 2,
    BW_LOG_DEBUG = 3,
} bw_log_level;

/*
 * The library never prints. An embedder that wants its log lines sets a callback: it is
 * called with one formatted line (no trailing newline) per event, from any thread, for
 * events at `max_level` or more severe. NULL (the default) discards everything.
 * Not thread-safe against concurrent library use: call it before opening anything.
 */
typedef void (*bw_log_fn)(void *user, bw_log_level level, const char *line);
BW_EXTERN void bw_set_log_callback(bw_log_fn fn, void *user, bw_log_level max_level);

/*
 * Interrupting the library (a signal, Ctrl-C, a launcher's SIGTERM).
 *
 * bw_interrupt() raises a process-wide flag. It is async-signal-safe: call it from a signal
 * handler. While the flag is raised, every blocking call of the library returns
 * BW_INTERRUPTED, in any thread: a call already waiting returns within 200 ms (calls in flight
 * to the coordinator or a worker are cancelled, not waited out), and a call made while the
 * flag is raised returns at once, before it does anything. That covers bw_loader_open,
 * bw_loader_open_at and bw_loader_open_elastic (joining, retrying), bw_loader_next (waiting for
 * a batch or a worker, in the middle of a fetch), bw_loader_next_epoch, bw_loader_set_epoch,
 * bw_loader_seek, bw_loader_commit, bw_job_checkpoint and bw_loader_rank_steps. A call that
 * had already done its work when the flag rose may still return its own result; the next call
 * then returns BW_INTERRUPTED. bw_interrupt_clear() lowers the flag.
 *
 * An interrupted call changes nothing that matters: bw_loader_next hands out no batch (the
 * one it was waiting for is handed out by the next call), an interrupted open creates no
 * loader (nothing is claimed, or the claim is released), an interrupted commit may or may not
 * have reached the coordinator (committing again is harmless). After bw_interrupt_clear() the
 * call can simply be repeated. bw_loader_close works while the flag is raised: it frees
 * everything and gives the rank back (LeaveJob) with a short deadline, returning within about
 * 250 ms.
 *
 * Typical use: a program's own signal handler calls bw_interrupt() and notes the signal; the
 * loop sees BW_INTERRUPTED, saves its cursor (bw_loader_cursor is never interrupted for
 * map-style jobs), clears or not, and closes. Or bw_interrupt_on_signals() below.
 */
BW_EXTERN void bw_interrupt(void);
BW_EXTERN void bw_interrupt_clear(void);

/* Whether the flag is raised. Async-signal-safe. */
BW_EXTERN int bw_interrupted(void);

/*
 * Installs handlers for SIGINT and SIGTERM that call bw_interrupt() and then pass the signal
 * on to what was there before: a previous handler function is called with the same
 * arguments (e.g. Python's own C-level handler, which then raises KeyboardInterrupt in the
 * main thread); for the default disposition the default is restored and the signal raised
 * again (the process ends as it would have; SA_RESETHAND of a previous handler is honoured
 * the same way). A signal whose disposition is SIG_IGN is left ignored: no handler is
 * installed for it, and it interrupts nothing. The handler keeps the previous handler's
 * flags (SA_RESTART, SA_ONSTACK) and mask.
 *
 * Idempotent: calling it again while its handlers are in place changes nothing; when
 * someone replaced a handler since (Python's signal.signal), it installs itself again on top,
 * passing signals on to the new handler. Returns BW_OK, or BW_INTERNAL when sigaction fails.
 *
 * This is how a binding makes its blocking calls interruptible: on BW_INTERRUPTED it calls
 * bw_interrupt_clear(), lets its own signal handling run (Python: KeyboardInterrupt, or the
 * program's SIGTERM handler), and if that returns, repeats the call.
 */
BW_EXTERN int bw_interrupt_on_signals(void);

#ifdef __cplusplus
}
#endif
#endif
