package dev.tandem.client;

/** {@link StreamCall#cancel()} ended the stream; delivered once, to {@link StreamListener#onError}. */
public class CancelledException extends TandemException {
    private static final long serialVersionUID = 1L;

    public CancelledException(String message) {
        super(message, 0, null, null, null, null);
    }
}
