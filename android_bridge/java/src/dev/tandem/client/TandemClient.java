package dev.tandem.client;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.HttpURLConnection;
import java.net.MalformedURLException;
import java.net.SocketTimeoutException;
import java.net.URL;
import java.nio.charset.Charset;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.Executor;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * A client for tandem's OpenAI-compatible HTTP API ({@code tandem serve}), with no dependency beyond
 * the JDK (Java 8; works on Android's {@code HttpURLConnection} too).
 *
 * <p>Thread-safe: share one instance. Every method except {@link #stream} blocks, so on Android call
 * them from a background thread (e.g. {@code withContext(Dispatchers.IO)}). The timeouts may be changed at
 * any time; a call uses the values current when it starts.
 *
 * <pre>{@code
 * TandemClient client = new TandemClient("http://127.0.0.1:8000/v1", "sk-...");
 * ChatCompletion reply = client.chat(ChatRequest.builder().user("Hello").maxTokens(32).build());
 * System.out.println(reply.getContent() + " via " + reply.getRouting().getTier());
 * }</pre>
 */
public final class TandemClient {
    private static final Charset UTF_8 = Charset.forName("UTF-8");
    private static final AtomicInteger THREAD_COUNTER = new AtomicInteger();

    private final String baseUrl;
    private final URL healthUrl;
    private final String apiKey;
    private volatile int connectTimeoutMillis = 10000;
    private volatile int readTimeoutMillis = 120000;

    /**
     * @param baseUrl the API root including {@code /v1}, e.g. {@code http://127.0.0.1:8000/v1} (a trailing
     *     slash is fine)
     * @param apiKey sent as {@code Authorization: Bearer <key>}; null (or empty) sends no key
     * @throws IllegalArgumentException if {@code baseUrl} is not an http(s) URL
     */
    public TandemClient(String baseUrl, String apiKey) {
        if (baseUrl == null) {
            throw new IllegalArgumentException("baseUrl must not be null");
        }
        String trimmed = baseUrl.trim();
        while (trimmed.endsWith("/")) {
            trimmed = trimmed.substring(0, trimmed.length() - 1);
        }
        try {
            URL url = new URL(trimmed);
            if (!"http".equals(url.getProtocol()) && !"https".equals(url.getProtocol())) {
                throw new IllegalArgumentException("baseUrl must be http or https: " + baseUrl);
            }
            this.healthUrl = new URL(url.getProtocol(), url.getHost(), url.getPort(), "/health");
        } catch (MalformedURLException e) {
            throw new IllegalArgumentException("bad baseUrl: " + baseUrl, e);
        }
        this.baseUrl = trimmed;
        this.apiKey = apiKey == null || apiKey.isEmpty() ? null : apiKey;
    }

    /** A client that sends no API key. */
    public TandemClient(String baseUrl) {
        this(baseUrl, null);
    }

    public String getBaseUrl() {
        return baseUrl;
    }

    public int getConnectTimeoutMillis() {
        return connectTimeoutMillis;
    }

    /** Time allowed to open the TCP connection (default 10 000 ms); 0 waits forever. */
    public TandemClient setConnectTimeoutMillis(int millis) {
        if (millis < 0) {
            throw new IllegalArgumentException("timeout must be >= 0");
        }
        this.connectTimeoutMillis = millis;
        return this;
    }

    public int getReadTimeoutMillis() {
        return readTimeoutMillis;
    }

    /**
     * Longest wait for the next bytes of a response (default 120 000 ms); 0 waits forever. For
     * {@link #chat} that bounds the whole generation (nothing arrives until it is done); for
     * {@link #stream} it is the longest gap between chunks.
     */
    public TandemClient setReadTimeoutMillis(int millis) {
        if (millis < 0) {
            throw new IllegalArgumentException("timeout must be >= 0");
        }
        this.readTimeoutMillis = millis;
        return this;
    }

    // ------------------------------------------------------------------------------------ the API

    /** POST {@code /chat/completions} and wait for the whole answer. */
    public ChatCompletion chat(ChatRequest request) throws TandemException {
        Map<String, Object> body = request.toBody();
        body.put("stream", Boolean.FALSE);
        Map<String, Object> reply = callJson("POST", baseUrl + "/chat/completions", Json.write(body));
        try {
            return ChatCompletion.fromJson(reply);
        } catch (Json.ParseException e) {
            throw new ServerException("unexpected chat completion: " + e.getMessage(), 200, null, null, null, e);
        }
    }

    /** {@link #stream(ChatRequest, StreamListener, Executor)} on a new daemon thread of its own. */
    public StreamCall stream(ChatRequest request, StreamListener listener) {
        return stream(request, listener, null);
    }

    /**
     * Starts a streamed chat completion and returns at once; the listener hears the deltas and then
     * exactly one terminal call on the worker.
     *
     * @param executor runs the worker (it blocks on the network for the whole stream, so give it a thread
     *     pool meant for I/O); null starts a new daemon thread
     * @throws java.util.concurrent.RejectedExecutionException if the executor refuses the task (the
     *     listener is then never called)
     */
    public StreamCall stream(final ChatRequest request, StreamListener listener, Executor executor) {
        final Map<String, Object> body = request.toBody();
        final StreamCall call = new StreamCall(listener);
        Runnable worker = new Runnable() {
            @Override
            public void run() {
                ChatCompletion result = null;
                TandemException error = null;
                try {
                    result = runStream(call, body);
                } catch (TandemException e) {
                    error = e;
                } catch (RuntimeException e) { // a bug here must still end the stream properly
                    error = new TandemException("internal error in the stream worker: " + e, e);
                } catch (Error e) { // e.g. an AssertionError thrown by onDelta: end the stream, then rethrow
                    call.finish(null, new TandemException("the stream worker failed: " + e, e));
                    throw e;
                }
                call.finish(result, error);
            }
        };
        if (executor == null) {
            Thread thread = new Thread(worker, "tandem-stream-" + THREAD_COUNTER.incrementAndGet());
            thread.setDaemon(true);
            thread.start();
        } else {
            executor.execute(worker);
        }
        return call;
    }

    /**
     * POST {@code /feedback}: how right the answer {@code responseId} (a {@link ChatCompletion#getId()} this key
     * received) was, {@code score} from 0 (wrong) to 1 (right). It labels the tier that answered, for the router
     * to learn from; the server needs {@code [traffic] record = true}.
     *
     * @return true when stored; false when the request was privacy-flagged (nothing about it is kept)
     * @throws NotFoundException for an id the server never recorded
     * @throws TandemException 403 (another key's response), 429 (too many), 400 (a score outside [0, 1])
     */
    public boolean feedback(String responseId, double score) throws TandemException {
        if (responseId == null) {
            throw new IllegalArgumentException("responseId must not be null");
        }
        Map<String, Object> body = new LinkedHashMap<String, Object>();
        body.put("id", responseId);
        body.put("score", Double.valueOf(score));
        Map<String, Object> reply = callJson("POST", baseUrl + "/feedback", Json.write(body));
        return Boolean.TRUE.equals(reply.get("recorded"));
    }

    /** The embedding model {@code tandem serve} serves on {@code /embeddings}. */
    public static final String EMBEDDING_MODEL = "all-MiniLM-L6-v2";

    /**
     * POST {@code /embeddings}: one vector per text, in the order given (all-MiniLM-L6-v2, 384 floats,
     * unit length; a text's vector does not depend on the others sent with it). Runs on the device.
     *
     * @throws InvalidRequestException for an empty list, an empty text or one over the model's 256-token window
     */
    public List<float[]> embeddings(List<String> texts) throws TandemException {
        if (texts == null || texts.isEmpty()) {
            throw new IllegalArgumentException("texts must hold at least one text");
        }
        Map<String, Object> body = new LinkedHashMap<String, Object>();
        body.put("model", EMBEDDING_MODEL);
        body.put("input", new ArrayList<String>(texts));
        Map<String, Object> reply = callJson("POST", baseUrl + "/embeddings", Json.write(body));
        List<Object> data = Json.getList(reply, "data");
        if (data == null || data.size() != texts.size()) {
            throw new ServerException("the embeddings reply does not hold one vector per text", 200, null, null, null, null);
        }
        float[][] vectors = new float[texts.size()][];
        for (Object item : data) {
            @SuppressWarnings("unchecked")
            Map<String, Object> entry = item instanceof Map ? (Map<String, Object>) item : null;
            Long index = Json.getLong(entry, "index");
            List<Object> values = Json.getList(entry, "embedding");
            if (index == null || index.longValue() < 0 || index.longValue() >= vectors.length || values == null) {
                throw new ServerException("an embedding without a valid index and vector", 200, null, null, null, null);
            }
            float[] vector = new float[values.size()];
            for (int i = 0; i < vector.length; i++) {
                Object value = values.get(i);
                if (!(value instanceof Number)) {
                    throw new ServerException("an embedding holds a value that is not a number", 200, null, null, null, null);
                }
                vector[i] = ((Number) value).floatValue();
            }
            vectors[index.intValue()] = vector;
        }
        List<float[]> out = new ArrayList<float[]>(vectors.length);
        for (float[] vector : vectors) {
            if (vector == null) {
                throw new ServerException("the embeddings reply skips an index", 200, null, null, null, null);
            }
            out.add(vector);
        }
        return out;
    }

    /** One text's embedding: {@link #embeddings(List)} of a one-element list. */
    public float[] embedding(String text) throws TandemException {
        List<String> one = new ArrayList<String>();
        one.add(text);
        return embeddings(one).get(0);
    }

    /** GET {@code /models}: the ids of the served models (tandem: auto, local, cloud, the model's name). */
    public List<String> listModels() throws TandemException {
        Map<String, Object> reply = callJson("GET", baseUrl + "/models", null);
        List<Object> data = Json.getList(reply, "data");
        if (data == null) {
            throw new ServerException("model list has no data array", 200, null, null, null, null);
        }
        List<String> ids = new ArrayList<String>();
        for (Object item : data) {
            if (item instanceof Map) {
                Object id = ((Map<?, ?>) item).get("id");
                if (id instanceof String) {
                    ids.add((String) id);
                }
            }
        }
        return ids;
    }

    /**
     * GET {@code scheme://host:port/health} (outside {@code /v1}; needs no key). True on 200 (the model is
     * loaded); false on any other status (503 while loading) or when the server cannot be reached.
     */
    public boolean health() {
        HttpURLConnection conn = null;
        try {
            conn = (HttpURLConnection) healthUrl.openConnection();
            conn.setConnectTimeout(connectTimeoutMillis);
            conn.setReadTimeout(readTimeoutMillis);
            conn.setUseCaches(false);
            int status = conn.getResponseCode();
            drainQuietly(status >= 400 ? conn.getErrorStream() : conn.getInputStream());
            return status == 200;
        } catch (IOException e) {
            return false;
        } finally {
            if (conn != null) {
                conn.disconnect();
            }
        }
    }

    // ------------------------------------------------------------------------------------ plumbing

    private HttpURLConnection open(String url, String method, boolean stream) throws IOException {
        HttpURLConnection conn = (HttpURLConnection) new URL(url).openConnection();
        conn.setRequestMethod(method);
        conn.setConnectTimeout(connectTimeoutMillis);
        conn.setReadTimeout(readTimeoutMillis);
        conn.setUseCaches(false);
        conn.setRequestProperty("Accept", stream ? "text/event-stream" : "application/json");
        if (apiKey != null) {
            conn.setRequestProperty("Authorization", "Bearer " + apiKey);
        }
        return conn;
    }

    /**
     * Sends the body (if any) in fixed-length streaming mode. In its default buffered mode the JDK re-sends
     * a POST by itself after an I/O error that comes before the response: a second generation, and for a
     * stream cancelled while it waits for the status line, a request sent again after cancel(). The price,
     * on the desktop JDK only (not Android's OkHttp-based one): it drops the body of a 401 to such a POST,
     * so a wrong key there gives an AuthenticationException without the server's message and code.
     */
    private static void send(HttpURLConnection conn, String json) throws IOException {
        if (json == null) {
            return;
        }
        byte[] bytes = json.getBytes(UTF_8);
        conn.setDoOutput(true);
        conn.setFixedLengthStreamingMode(bytes.length);
        conn.setRequestProperty("Content-Type", "application/json; charset=utf-8");
        OutputStream out = conn.getOutputStream();
        try {
            out.write(bytes);
        } finally {
            out.close();
        }
    }

    /** One request whose 2xx reply is a JSON object; any failure becomes the typed exception. */
    private Map<String, Object> callJson(String method, String url, String json) throws TandemException {
        HttpURLConnection conn = null;
        int status = 0;
        try {
            conn = open(url, method, false);
            send(conn, json);
            status = conn.getResponseCode();
            if (status < 200 || status >= 300) {
                throw errorFrom(conn, status);
            }
            String text = readFully(conn.getInputStream());
            try {
                return Json.parseObject(text);
            } catch (Json.ParseException e) {
                throw new ServerException("the server's reply is not a JSON object (" + e.getMessage() + ")", status,
                        null, null, null, e);
            }
        } catch (IOException e) {
            throw ioFailure(e, status);
        } finally {
            if (conn != null && status == 0) {
                conn.disconnect(); // nothing usable came back: do not return the socket to the pool
            }
        }
    }

    private ChatCompletion runStream(StreamCall call, Map<String, Object> requestBody) throws TandemException {
        if (call.cancelRequested()) {
            throw new CancelledException("stream cancelled before it started");
        }
        Map<String, Object> body = new LinkedHashMap<String, Object>(requestBody);
        body.put("stream", Boolean.TRUE);
        Map<String, Object> options = new LinkedHashMap<String, Object>();
        Object given = body.get("stream_options");
        if (given instanceof Map) {
            for (Map.Entry<?, ?> e : ((Map<?, ?>) given).entrySet()) {
                options.put(String.valueOf(e.getKey()), e.getValue());
            }
        }
        options.put("include_usage", Boolean.TRUE); // the final chunk then carries usage
        body.put("stream_options", options);

        HttpURLConnection conn = null;
        InputStream in = null;
        boolean clean = false;
        int status = 0;
        try {
            conn = open(baseUrl + "/chat/completions", "POST", true);
            call.attach(conn);
            send(conn, Json.write(body));
            status = conn.getResponseCode();
            if (status < 200 || status >= 300) {
                throw errorFrom(conn, status);
            }
            in = conn.getInputStream();
            SseReader reader = new SseReader(in);
            StreamAssembler assembler = new StreamAssembler();
            String data;
            while ((data = reader.nextData()) != null) {
                if (call.cancelRequested()) {
                    throw new CancelledException("stream cancelled");
                }
                if ("[DONE]".equals(data.trim())) {
                    clean = true;
                    return assembler.build();
                }
                Map<String, Object> chunk;
                try {
                    chunk = Json.parseObject(data);
                } catch (Json.ParseException e) {
                    throw new ServerException("malformed stream chunk (" + e.getMessage() + ")", status, null, null,
                            null, e);
                }
                Map<String, Object> error = Json.getMap(chunk, "error");
                if (error != null) {
                    throw Errors.forStreamEvent(error);
                }
                String delta = assembler.add(chunk);
                if (delta != null && !delta.isEmpty()) {
                    call.deliverDelta(delta);
                }
            }
            throw new ConnectionException("the stream ended before data: [DONE]", status, null);
        } catch (IOException e) {
            if (call.cancelRequested()) {
                throw new CancelledException("stream cancelled");
            }
            throw ioFailure(e, status);
        } finally {
            if (clean) {
                closeQuietly(in); // [DONE] is the last event: the connection may go back to the pool
            } else if (conn != null) {
                conn.disconnect(); // the server sees the disconnect and stops generating
            }
        }
    }

    private static TandemException errorFrom(HttpURLConnection conn, int status) {
        String body;
        try {
            body = readFully(conn.getErrorStream());
        } catch (IOException e) {
            body = "";
        }
        return Errors.forResponse(status, body, conn.getHeaderField("Retry-After"));
    }

    private static TandemException ioFailure(IOException e, int status) {
        if (e instanceof SocketTimeoutException) {
            return new RequestTimeoutException("timed out: " + e.getMessage(), status, e);
        }
        return new ConnectionException("connection failed: " + e, status, e);
    }

    /** The whole stream as UTF-8 text; a null stream (no body) is empty. Closes it. */
    private static String readFully(InputStream in) throws IOException {
        if (in == null) {
            return "";
        }
        try {
            ByteArrayOutputStream out = new ByteArrayOutputStream();
            byte[] buffer = new byte[8192];
            int n;
            while ((n = in.read(buffer)) > 0) {
                out.write(buffer, 0, n);
            }
            return new String(out.toByteArray(), UTF_8);
        } finally {
            in.close();
        }
    }

    private static void drainQuietly(InputStream in) {
        try {
            readFully(in);
        } catch (IOException ignored) {
            // only draining so the connection can be reused
        }
    }

    private static void closeQuietly(InputStream in) {
        if (in != null) {
            try {
                in.close();
            } catch (IOException ignored) {
                // nothing left to read
            }
        }
    }
}
