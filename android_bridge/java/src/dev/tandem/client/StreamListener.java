package dev.tandem.client;

/**
 * Receives one stream's events, all on the stream's worker thread (never on the thread that called
 * {@link TandemClient#stream}): any number of {@link #onDelta} calls, then exactly one of
 * {@link #onComplete} or {@link #onError}. Calls never overlap. On Android, post to the main thread
 * yourself (e.g. {@code Handler.post} or {@code withContext(Dispatchers.Main)}) before touching views.
 *
 * <p>An exception thrown by {@code onDelta} aborts the stream and arrives at {@code onError} as a
 * {@link TandemException} with it as the cause; one thrown by {@code onComplete} or {@code onError}
 * propagates to the worker thread's uncaught-exception handler (it is a bug in the listener).
 */
public interface StreamListener {
    /** A piece of the answer's text, never empty, in order. */
    void onDelta(String text);

    /** The stream ended with {@code [DONE]}; {@code completion} holds the whole text, usage and routing. */
    void onComplete(ChatCompletion completion);

    /** The stream failed, or was cancelled ({@link CancelledException}). */
    void onError(TandemException error);
}
