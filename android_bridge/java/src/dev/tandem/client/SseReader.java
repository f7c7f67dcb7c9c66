package dev.tandem.client;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.nio.charset.Charset;

/**
 * Server-sent events read incrementally from a byte stream: each {@link #nextData()} blocks only until the
 * next event is complete. Lines end in LF, CRLF or CR and are decoded as UTF-8 whole (so a character split
 * across network reads is intact); {@code data:} with or without one space, several {@code data} lines of
 * one event joined by LF, {@code :} comment lines and other fields ignored, a blank line ends an event.
 * Not thread-safe: one reader per stream, used by its worker thread.
 */
final class SseReader {
    private static final Charset UTF_8 = Charset.forName("UTF-8");
    /** A line longer than this is a broken server, not a chunk: fail instead of filling the heap. */
    static final int MAX_LINE_BYTES = 16 * 1024 * 1024;

    private final InputStream in;
    private final byte[] buffer = new byte[8192];
    private int pos;
    private int limit;
    private boolean skipLf; // the previous line ended in CR: a following LF belongs to it
    private boolean firstLine = true;
    private final ByteArrayOutputStream line = new ByteArrayOutputStream(256);

    SseReader(InputStream in) {
        this.in = in;
    }

    /**
     * The data of the next event that has any (events with no {@code data} field are skipped), or null at
     * the end of the stream. An event cut off by the end of the stream (no blank line after it) is dropped,
     * as the SSE specification says.
     */
    String nextData() throws IOException {
        StringBuilder data = null;
        String text;
        while ((text = readLine()) != null) {
            if (text.isEmpty()) {
                if (data != null) {
                    return data.toString();
                }
                continue;
            }
            if (text.charAt(0) == ':') {
                continue; // comment (keep-alive)
            }
            int colon = text.indexOf(':');
            String field = colon < 0 ? text : text.substring(0, colon);
            if (!"data".equals(field)) {
                continue; // event, id, retry: not used by OpenAI streams
            }
            String value = colon < 0 ? "" : text.substring(colon + 1);
            if (value.startsWith(" ")) {
                value = value.substring(1);
            }
            if (data == null) {
                data = new StringBuilder(value);
            } else {
                data.append('\n').append(value);
            }
        }
        return null;
    }

    /** The next whole line without its terminator, or null at the end (a final unterminated line is dropped). */
    private String readLine() throws IOException {
        line.reset();
        while (true) {
            if (pos == limit) {
                limit = in.read(buffer, 0, buffer.length);
                pos = 0;
                if (limit <= 0) {
                    limit = 0;
                    return null;
                }
            }
            byte b = buffer[pos++];
            if (skipLf) {
                skipLf = false;
                if (b == '\n') {
                    continue;
                }
            }
            if (b == '\n' || b == '\r') {
                skipLf = b == '\r';
                String text = new String(line.toByteArray(), UTF_8);
                if (firstLine) {
                    firstLine = false;
                    if (text.startsWith("\uFEFF")) {
                        text = text.substring(1); // a byte-order mark before the first line is ignored
                    }
                }
                return text;
            }
            if (line.size() >= MAX_LINE_BYTES) {
                throw new IOException("server-sent event line longer than " + MAX_LINE_BYTES + " bytes");
            }
            line.write(b);
        }
    }
}
