package dev.tandem.client;

import java.net.HttpURLConnection;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * A running stream from {@link TandemClient#stream}. All methods are safe to call from any thread,
 * including from inside the listener.
 */
public final class StreamCall {
    private static final int RUNNING = 0;
    private static final int CANCELLED = 1;
    private static final int FINISHED = 2;

    private final AtomicInteger state = new AtomicInteger(RUNNING);
    private final CountDownLatch done = new CountDownLatch(1);
    /** Held while onDelta runs, so cancel() can wait for one in progress. */
    private final Object deliveryLock = new Object();
    private final StreamListener listener;
    private volatile HttpURLConnection connection;

    StreamCall(StreamListener listener) {
        if (listener == null) {
            throw new IllegalArgumentException("listener must not be null");
        }
        this.listener = listener;
    }

    /**
     * Stops the stream: disconnects the HTTP connection (the server then stops generating) and makes the
     * listener's terminal call {@link StreamListener#onError} with a {@link CancelledException}, once, on
     * the worker thread. After {@code cancel} returns no further {@code onDelta} is made: one already in
     * progress on another thread is waited for (so do not call {@code cancel} while holding a lock that
     * {@code onDelta} needs).
     *
     * @return true if this call cancelled the stream; false if it had already finished or been cancelled
     *     (then the listener's terminal call is whatever it was going to be)
     */
    public boolean cancel() {
        if (!state.compareAndSet(RUNNING, CANCELLED)) {
            return false;
        }
        HttpURLConnection c = connection;
        if (c != null) {
            c.disconnect(); // unblocks the worker's read with an IOException
        }
        synchronized (deliveryLock) {
            // Waits out an onDelta in progress; every later one sees CANCELLED and is skipped.
        }
        return true;
    }

    /** True once the listener's terminal call ({@code onComplete} or {@code onError}) has returned. */
    public boolean isDone() {
        return done.getCount() == 0;
    }

    /** True if {@link #cancel()} stopped this stream. */
    public boolean isCancelled() {
        return state.get() == CANCELLED;
    }

    /**
     * Waits up to {@code timeoutMillis} for the listener's terminal call to return.
     *
     * @return true if the stream is done, false if the time ran out first
     */
    public boolean await(long timeoutMillis) throws InterruptedException {
        return done.await(timeoutMillis, TimeUnit.MILLISECONDS);
    }

    // ----------------------------------------------------------------- the worker's side (package use)

    boolean cancelRequested() {
        return state.get() == CANCELLED;
    }

    /** Registers the live connection; if cancel() already ran, disconnects it at once. */
    void attach(HttpURLConnection c) {
        connection = c;
        if (state.get() == CANCELLED) { // cancel() may have read `connection` before it was set
            c.disconnect();
        }
    }

    void deliverDelta(String text) throws TandemException {
        synchronized (deliveryLock) {
            if (state.get() != RUNNING) {
                throw new CancelledException("stream cancelled");
            }
            try {
                listener.onDelta(text);
            } catch (RuntimeException e) {
                throw new TandemException("StreamListener.onDelta threw " + e, e);
            }
        }
    }

    /** The worker's last act: exactly one terminal call, CancelledException if cancel() won the race. */
    void finish(ChatCompletion result, TandemException error) {
        try {
            if (!state.compareAndSet(RUNNING, FINISHED)) {
                listener.onError(new CancelledException("stream cancelled"));
            } else if (error != null) {
                listener.onError(error);
            } else {
                listener.onComplete(result);
            }
        } finally {
            done.countDown();
        }
    }
}
