package dev.tandem.client;

import java.io.ByteArrayInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.net.ServerSocket;
import java.nio.charset.Charset;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * Checks of the client, as a plain program (no JUnit): {@code java dev.tandem.client.TandemClientTest
 * [BASE_URL API_KEY]}. Without arguments only the offline checks run (JSON, SSE parsing, error mapping);
 * with a live {@code tandem serve} ({@code --cloud none}, the key in its key file) the network ones too.
 * Prints PASS/FAIL per check and exits 0 only when all pass.
 */
public final class TandemClientTest {
    private static final Charset UTF_8 = Charset.forName("UTF-8");
    private static final String LONG_PROMPT = "Write a very long story about a dragon who learns to bake bread. "
            + "Describe every step in detail.";

    private static final List<String> failures = Collections.synchronizedList(new ArrayList<String>());
    private static int passed;

    private interface Check {
        void run() throws Exception;
    }

    private TandemClientTest() {
    }

    public static void main(String[] args) throws Exception {
        long start = System.nanoTime();
        run("json: escaping round trip", TandemClientTest::jsonRoundTrip);
        run("json: parsed types and surrogate escapes", TandemClientTest::jsonTypes);
        run("json: malformed input is a ParseException", TandemClientTest::jsonMalformed);
        run("json: writer rejects what JSON cannot hold", TandemClientTest::jsonWriterRejects);
        run("sse: incremental parsing", TandemClientTest::sseParsing);
        run("errors: status and body map to typed exceptions", TandemClientTest::errorMapping);
        run("request: body fields", TandemClientTest::requestBody);
        run("request: tools, tool_choice, response_format, tool turns", TandemClientTest::toolRequestBody);
        run("client: unreachable server", TandemClientTest::unreachable);

        if (args.length >= 2) {
            final String baseUrl = args[0];
            final String key = args[1];
            final TandemClient client = new TandemClient(baseUrl + "/", key); // trailing slash is accepted
            run("health", () -> check(client.health(), "health() should be true"));
            run("listModels", () -> listModels(client));
            run("chat: non-streaming", () -> chat(client));
            run("feedback: recorded, and an unknown id -> NotFoundException", () -> feedback(client));
            run("embeddings: unit vectors, batch equals single, empty text refused", () -> embeddings(client));
            run("chat: private request, odd characters, extra field", () -> chatPrivate(client));
            run("chat: temperature 5 -> InvalidRequestException", () -> invalidRequest(client));
            run("chat: unknown model -> NotFoundException", () -> unknownModel(client));
            run("auth: wrong key -> AuthenticationException", () -> wrongKey(baseUrl));
            run("auth: missing key -> AuthenticationException", () -> missingKey(baseUrl));
            run("chat: tool calls, whole and streamed, and the result sent back", () -> toolCalls(client));
            run("stream: deltas add up to onComplete", () -> stream(client));
            run("stream: error status -> onError", () -> streamError(client));
            run("stream: cancel after the first delta", () -> cancelMidStream(client));
            run("stream: cancel from inside onDelta", () -> cancelInsideListener(client));
            run("stream: two at once from one client", () -> concurrentStreams(client));
            run("chat: read timeout -> RequestTimeoutException", () -> readTimeout(baseUrl, key));
            run("chat: still works after the failures", () -> chat(client));
        } else {
            System.out.println("(no BASE_URL API_KEY given: server checks skipped)");
        }

        double seconds = (System.nanoTime() - start) / 1e9;
        System.out.printf("%d passed, %d failed in %.1f s%n", passed, failures.size(), seconds);
        if (!failures.isEmpty()) {
            System.out.println("FAILED:");
            for (String f : failures) {
                System.out.println("  " + f);
            }
            System.exit(1);
        }
        System.exit(0); // the daemon stream threads must not keep the JVM alive
    }

    private static void run(String name, Check check) {
        long t0 = System.nanoTime();
        try {
            check.run();
            passed++;
            System.out.printf("PASS %s (%d ms)%n", name, (System.nanoTime() - t0) / 1000000);
        } catch (Throwable t) {
            String message = name + ": " + t;
            failures.add(message);
            System.out.println("FAIL " + message);
            t.printStackTrace(System.out);
        }
    }

    private static void check(boolean condition, String message) {
        if (!condition) {
            throw new AssertionError(message);
        }
    }

    private static void checkEquals(Object expected, Object actual, String what) {
        if (expected == null ? actual != null : !expected.equals(actual)) {
            throw new AssertionError(what + ": expected <" + expected + "> but was <" + actual + ">");
        }
    }

    private static <T extends Throwable> T expect(Class<T> type, Check body) throws Exception {
        try {
            body.run();
        } catch (Throwable t) {
            if (type.isInstance(t)) {
                return type.cast(t);
            }
            throw new AssertionError("expected " + type.getSimpleName() + " but got " + t, t);
        }
        throw new AssertionError("expected " + type.getSimpleName() + " but nothing was thrown");
    }

    // ------------------------------------------------------------------------------ offline checks

    private static void jsonRoundTrip() throws Exception {
        String nasty = "quote\" backslash\\ slash/ nl\n cr\r tab\t bs\b ff\f nul\u0000 us\u001f del\u007f "
                + "ls\u2028 \u00e9 \u4e2d\u6587 emoji\uD83D\uDE00 lone\uD800x";
        String written = Json.write(nasty);
        check(written.contains("\\\"") && written.contains("\\\\") && written.contains("\\n")
                && written.contains("\\u0000") && written.contains("\\u001f") && written.contains("\\u2028")
                && written.contains("\\ud800"), "escapes missing in " + written);
        check(written.contains("\uD83D\uDE00"), "a valid surrogate pair should be written as is: " + written);
        for (int i = 0; i < written.length(); i++) {
            check(written.charAt(i) >= 0x20, "raw control character in output at " + i);
        }
        checkEquals(nasty, Json.parse(written), "string round trip");

        Map<String, Object> nested = new LinkedHashMap<String, Object>();
        nested.put("s", nasty);
        nested.put("n", Long.valueOf(-42));
        nested.put("big", Long.valueOf(Long.MAX_VALUE));
        nested.put("d", Double.valueOf(0.25));
        nested.put("e", Double.valueOf(1.5e-300));
        nested.put("t", Boolean.TRUE);
        nested.put("f", Boolean.FALSE);
        nested.put("z", null);
        nested.put("list", new ArrayList<Object>(Arrays.<Object>asList(Long.valueOf(1), "two", null,
                new ArrayList<Object>(), new LinkedHashMap<String, Object>())));
        nested.put("key \"with\" \u0001 escapes", "v");
        checkEquals(nested, Json.parse(Json.write(nested)), "structure round trip");
        checkEquals("{\"a\":[1,2.5,\"x\",null,true]}",
                Json.write(Json.parse(" { \"a\" : [ 1 , 2.5 , \"x\" , null , true ] } ")), "compact output");
    }

    private static void jsonTypes() throws Exception {
        checkEquals("\uD83D\uDE00", Json.parse("\"\\ud83d\\ude00\""), "escaped surrogate pair");
        checkEquals("\uD83D\uDE00", Json.parse("\"\uD83D\uDE00\""), "raw non-BMP character");
        checkEquals("A/\u00e9", Json.parse("\"\\u0041\\/\\u00E9\""), "\\u and \\/ escapes");
        checkEquals(Long.valueOf(7), Json.parse("7"), "integer");
        checkEquals(Long.valueOf(-9223372036854775808L), Json.parse("-9223372036854775808"), "Long.MIN_VALUE");
        checkEquals(Double.valueOf(9.223372036854775808E18), Json.parse("9223372036854775808"), "too big for long");
        checkEquals(Double.valueOf(1.5), Json.parse("1.5"), "fraction");
        checkEquals(Double.valueOf(1000), Json.parse("1E3"), "exponent");
        checkEquals(Double.valueOf(-0.0), Json.parse("-0.0"), "negative zero");
        check(Json.parse("null") == null, "null");
        List<?> list = (List<?>) Json.parse("[[],{}]");
        check(list.get(0) instanceof List && list.get(1) instanceof Map, "empty containers");
        StringBuilder deep = new StringBuilder();
        for (int i = 0; i < 100; i++) {
            deep.append('[');
        }
        for (int i = 0; i < 100; i++) {
            deep.append(']');
        }
        check(Json.parse(deep.toString()) instanceof List, "100 levels of nesting parse");
    }

    private static void jsonMalformed() throws Exception {
        StringBuilder tooDeep = new StringBuilder();
        for (int i = 0; i < 100000; i++) {
            tooDeep.append('[');
        }
        String[] bad = {
            "", "   ", "{", "}", "[1,]", "[1 2]", "{\"a\":}", "{\"a\" 1}", "{a:1}", "{\"a\":1,}", "tru", "nul",
            "\"abc", "\"a\\x\"", "\"\\u12G4\"", "\"\\u12\"", "\"raw\u0001control\"", "01", "1.", "-", ".5", "1e",
            "+1", "NaN", "Infinity", "[1] x", "{} {}", "'single'", tooDeep.toString(),
        };
        for (final String text : bad) {
            String shown = text.length() > 30 ? text.substring(0, 30) + "..." : text;
            try {
                Object value = Json.parse(text);
                throw new AssertionError("parsed malformed " + shown + " as " + value);
            } catch (Json.ParseException expected) {
                check(expected.getOffset() >= 0, "offset");
            } catch (RuntimeException | StackOverflowError e) {
                throw new AssertionError("malformed " + shown + " threw " + e + " instead of a ParseException", e);
            }
        }
        expect(Json.ParseException.class, () -> Json.parseObject("[1]"));
        expect(Json.ParseException.class, () -> Json.parse(null));
    }

    private static void jsonWriterRejects() throws Exception {
        expect(IllegalArgumentException.class, () -> Json.write(Double.valueOf(Double.NaN)));
        expect(IllegalArgumentException.class, () -> Json.write(Float.valueOf(Float.POSITIVE_INFINITY)));
        expect(IllegalArgumentException.class, () -> Json.write(new Object()));
        final List<Object> cycle = new ArrayList<Object>();
        cycle.add(cycle);
        expect(IllegalArgumentException.class, () -> Json.write(cycle));
        expect(IllegalArgumentException.class, () -> ChatRequest.builder().extra("x", new Object()));
    }

    /** An InputStream that hands out one byte per read, like a slow network. */
    private static final class TrickleStream extends InputStream {
        private final byte[] bytes;
        private int pos;

        TrickleStream(byte[] bytes) {
            this.bytes = bytes;
        }

        @Override
        public int read() {
            return pos < bytes.length ? bytes[pos++] & 0xff : -1;
        }

        @Override
        public int read(byte[] b, int off, int len) {
            if (pos >= bytes.length) {
                return -1;
            }
            b[off] = bytes[pos++];
            return 1;
        }
    }

    private static void sseParsing() throws Exception {
        String body = "\uFEFF: keep-alive comment\r\n"
                + "data: {\"a\":1}\r\n\r\n"
                + "data:no-space\n\n"
                + "event: message\nid: 7\nretry: 10\ndata: line one\ndata: line two\n\n"
                + "data: caf\u00e9 \uD83D\uDE00\r\r"
                + "id: no data here\n\n"
                + "data\n\n"
                + "data: [DONE]\n\n"
                + "data: cut off at the end";
        for (int pass = 0; pass < 2; pass++) {
            byte[] bytes = body.getBytes(UTF_8);
            InputStream in = pass == 0 ? new ByteArrayInputStream(bytes) : new TrickleStream(bytes);
            SseReader reader = new SseReader(in);
            List<String> events = new ArrayList<String>();
            String data;
            while ((data = reader.nextData()) != null) {
                events.add(data);
            }
            checkEquals(Arrays.asList("{\"a\":1}", "no-space", "line one\nline two", "caf\u00e9 \uD83D\uDE00", "",
                    "[DONE]"), events, "events (pass " + pass + ")");
        }
    }

    private static void errorMapping() throws Exception {
        TandemException e = Errors.forResponse(400, "{\"error\":{\"message\":\"bad t\",\"type\":\"invalid_request_error\","
                + "\"param\":\"temperature\",\"code\":null}}", null);
        check(e instanceof InvalidRequestException, "400 -> " + e.getClass());
        checkEquals("bad t", e.getMessage(), "message");
        checkEquals("temperature", e.getParam(), "param");
        checkEquals("invalid_request_error", e.getType(), "type");
        checkEquals(Integer.valueOf(400), Integer.valueOf(e.getHttpStatus()), "status");
        check(e.getCode() == null, "code null");

        e = Errors.forResponse(429, "{\"error\":{\"message\":\"slow down\",\"type\":\"requests\",\"code\":\"rate_limit_exceeded\"}}", "7");
        check(e instanceof RateLimitException, "429 -> " + e.getClass());
        checkEquals(Long.valueOf(7), ((RateLimitException) e).getRetryAfterSeconds(), "Retry-After");
        e = Errors.forResponse(503, "{\"error\":{\"message\":\"busy\",\"type\":\"server_overloaded\"}}", "2");
        check(e instanceof ServiceUnavailableException && e instanceof ServerException, "503 -> " + e.getClass());
        checkEquals(Long.valueOf(2), ((ServiceUnavailableException) e).getRetryAfterSeconds(), "503 Retry-After");
        e = Errors.forResponse(502, "<html>bad gateway</html>", null);
        check(e instanceof ServerException && e.getMessage().contains("bad gateway"), "502 html -> " + e);
        e = Errors.forResponse(401, "", null);
        check(e instanceof AuthenticationException, "401 empty body -> " + e.getClass());
        e = Errors.forResponse(404, "{\"detail\":\"Not Found\"}", null);
        check(e instanceof NotFoundException && "Not Found".equals(e.getMessage()), "404 detail -> " + e);
        e = Errors.forResponse(418, "{\"error\":{\"message\":\"teapot\",\"code\":42}}", null);
        check(e.getClass() == TandemException.class && "42".equals(e.getCode()), "418 -> " + e.getClass());
        Map<String, Object> event = Json.parseObject("{\"message\":\"engine broke\",\"type\":\"server_error\"}");
        e = Errors.forStreamEvent(event);
        check(e instanceof ServerException && e.getHttpStatus() == 200, "stream event -> " + e.getClass());
        e = Errors.forStreamEvent(Json.parseObject("{\"message\":\"too long\",\"type\":\"invalid_request_error\","
                + "\"param\":\"messages\",\"code\":\"context_length_exceeded\"}"));
        check(e instanceof InvalidRequestException && "messages".equals(e.getParam()), "stream 400 event -> " + e);

        long now = 1700000000000L; // Tue, 14 Nov 2023 22:13:20 GMT
        checkEquals(Long.valueOf(30), Errors.parseRetryAfter("Tue, 14 Nov 2023 22:13:50 GMT", now), "date");
        checkEquals(Long.valueOf(0), Errors.parseRetryAfter("Tue, 14 Nov 2023 22:00:00 GMT", now), "past date");
        checkEquals(Long.valueOf(2), Errors.parseRetryAfter(" 1.5 ", now), "fractional seconds");
        check(Errors.parseRetryAfter("soon", now) == null && Errors.parseRetryAfter(null, now) == null
                && Errors.parseRetryAfter("-3", now) == null, "bad Retry-After -> null");
    }

    private static void requestBody() throws Exception {
        ChatRequest request = ChatRequest.builder()
                .system("sys").user("hi").assistant("hello").user("more")
                .maxTokens(5).temperature(0.5).topP(0.9).seed(3).stop("a", "b").privateRequest(true)
                .extra("ignore_eos", Boolean.TRUE).extra("max_tokens", Long.valueOf(6))
                .build();
        Map<String, Object> body = Json.parseObject(request.toJson());
        checkEquals("auto", body.get("model"), "default model");
        checkEquals(Long.valueOf(4), Long.valueOf(((List<?>) body.get("messages")).size()), "messages");
        checkEquals(Long.valueOf(6), body.get("max_tokens"), "extra overrides a typed field");
        checkEquals(Double.valueOf(0.5), body.get("temperature"), "temperature");
        checkEquals(Double.valueOf(0.9), body.get("top_p"), "top_p");
        checkEquals(Long.valueOf(3), body.get("seed"), "seed");
        checkEquals(Arrays.asList("a", "b"), body.get("stop"), "stop");
        checkEquals(Boolean.TRUE, body.get("private"), "private");
        checkEquals(Boolean.TRUE, body.get("ignore_eos"), "extra");
        check(!body.containsKey("stream"), "stream is the client's to set");
        expect(IllegalStateException.class, () -> ChatRequest.builder().build());
        Map<String, Object> derived = request.toBuilder().model("local").build().toBody();
        checkEquals("local", derived.get("model"), "toBuilder");
    }

    private static int deadPort() throws IOException {
        ServerSocket socket = new ServerSocket(0);
        int port = socket.getLocalPort();
        socket.close();
        return port;
    }

    private static void unreachable() throws Exception {
        final TandemClient dead = new TandemClient("http://127.0.0.1:" + deadPort() + "/v1", "k");
        check(!dead.health(), "health() of a dead port should be false");
        ConnectionException e = expect(ConnectionException.class, () -> dead.listModels());
        checkEquals(Integer.valueOf(0), Integer.valueOf(e.getHttpStatus()), "no HTTP status");
        final Recorder recorder = new Recorder();
        StreamCall call = dead.stream(ChatRequest.builder().user("hi").build(), recorder);
        check(call.await(10000), "stream to a dead port should end");
        recorder.checkOneError(ConnectionException.class);
        expect(IllegalArgumentException.class, () -> new TandemClient("ftp://x/v1", null));
    }

    // ------------------------------------------------------------------------------ server checks

    private static Map<String, Object> weatherTool() {
        Map<String, Object> city = new LinkedHashMap<String, Object>();
        city.put("type", "string");
        city.put("maxLength", Long.valueOf(40));
        Map<String, Object> parameters = new LinkedHashMap<String, Object>();
        parameters.put("type", "object");
        parameters.put("properties", Collections.<String, Object>singletonMap("city", city));
        parameters.put("required", Collections.<Object>singletonList("city"));
        Map<String, Object> function = new LinkedHashMap<String, Object>();
        function.put("name", "get_weather");
        function.put("description", "Get the current weather in a city");
        function.put("parameters", parameters);
        Map<String, Object> tool = new LinkedHashMap<String, Object>();
        tool.put("type", "function");
        tool.put("function", function);
        return tool;
    }

    private static ChatRequest weatherRequest() {
        return ChatRequest.builder().model("local").user("What's the weather like in Paris?").maxTokens(60).temperature(0)
                .tools(Collections.singletonList(weatherTool())).toolChoice("get_weather").build();
    }

    private static void toolRequestBody() throws Exception {
        ToolCall call = new ToolCall("call_1", "get_weather", "{\"city\": \"Paris\"}");
        ChatRequest request = ChatRequest.builder().user("Weather?")
                .messages(Arrays.asList(ChatRequest.Message.assistantToolCalls(Collections.singletonList(call)),
                        ChatRequest.Message.toolResult("call_1", "sunny")))
                .tools(Collections.singletonList(weatherTool())).toolChoice("get_weather")
                .responseFormat(Collections.<String, Object>singletonMap("type", "json_object")).build();
        Map<String, Object> body = Json.parseObject(request.toJson());
        List<Object> messages = Json.getList(body, "messages");
        @SuppressWarnings("unchecked")
        Map<String, Object> assistant = (Map<String, Object>) messages.get(1);
        @SuppressWarnings("unchecked")
        Map<String, Object> result = (Map<String, Object>) messages.get(2);
        check(assistant.containsKey("content") && assistant.get("content") == null, "a calls-only turn sends content null");
        checkEquals(call.getArguments(), ToolCall.listFromJson(assistant).get(0).getArguments(), "arguments round trip");
        checkEquals("tool", result.get("role"), "result role");
        checkEquals("call_1", result.get("tool_call_id"), "result id");
        checkEquals("get_weather", Json.getString(Json.getMap(Json.getMap(body, "tool_choice"), "function"), "name"), "named choice");
        checkEquals("json_object", Json.getString(Json.getMap(body, "response_format"), "type"), "response_format");
        checkEquals("required", Json.getString(Json.parseObject(ChatRequest.builder().user("x").toolChoice("required").build().toJson()),
                "tool_choice"), "plain choice");
    }

    private static void toolCalls(TandemClient client) throws Exception {
        ChatCompletion reply = client.chat(weatherRequest());
        checkEquals("tool_calls", reply.getFinishReason(), "finish reason");
        checkEquals(Integer.valueOf(1), Integer.valueOf(reply.getToolCalls().size()), "calls: " + reply);
        ToolCall call = reply.getToolCalls().get(0);
        check("get_weather".equals(call.getName()) && call.getArguments().contains("city") && call.getId().startsWith("call_"),
                "call: " + call);
        Recorder recorder = new Recorder();
        StreamCall stream = client.stream(weatherRequest(), recorder);
        check(stream.await(60000), "tool stream did not finish in 60 s");
        ChatCompletion streamed = recorder.completion;
        check(streamed != null && streamed.getToolCalls().size() == 1, "streamed calls: " + streamed);
        checkEquals(call.getArguments(), streamed.getToolCalls().get(0).getArguments(), "greedy: the same arguments streamed");
        checkEquals("tool_calls", streamed.getFinishReason(), "streamed finish reason");
        ChatRequest next = ChatRequest.builder().model("local").user("What's the weather like in Paris?")
                .messages(Arrays.asList(ChatRequest.Message.assistantToolCalls(reply.getToolCalls()),
                        ChatRequest.Message.toolResult(call.getId(), "{\"sky\": \"sunny\", \"celsius\": 24}")))
                .maxTokens(40).temperature(0).build();
        ChatCompletion answer = client.chat(next);
        check(answer.getToolCalls().isEmpty() && answer.getContent() != null && !answer.getContent().isEmpty(), "answer: " + answer);
    }

    private static ChatRequest shortRequest() {
        return ChatRequest.builder().user("Say hello in five words.").maxTokens(16).temperature(0).build();
    }

    private static ChatRequest longRequest() {
        // ignore_eos (a vLLM extension tandem accepts) makes the length certain: 200 tokens take seconds here.
        return ChatRequest.builder().user(LONG_PROMPT).maxTokens(200).extra("ignore_eos", Boolean.TRUE).build();
    }

    private static void listModels(TandemClient client) throws Exception {
        List<String> models = client.listModels();
        check(models.contains("auto") && models.contains("local"), "models: " + models);
    }

    private static void chat(TandemClient client) throws Exception {
        ChatCompletion reply = client.chat(shortRequest());
        check(reply.getContent() != null && !reply.getContent().isEmpty(), "empty content: " + reply);
        check(reply.getFinishReason() != null, "no finish reason: " + reply);
        check(reply.getId() != null && reply.getModel() != null, "id/model: " + reply);
        check(reply.getUsage() != null && reply.getUsage().getCompletionTokens() > 0, "usage: " + reply.getUsage());
        check(reply.getUsage().getTotalTokens() == reply.getUsage().getPromptTokens()
                + reply.getUsage().getCompletionTokens(), "usage total: " + reply.getUsage());
        check(reply.getRouting() != null, "no routing");
        checkEquals("local", reply.getRouting().getTier(), "routing tier");
        check(!reply.getRouting().isDegraded() || reply.getRouting().getDegradedReason() != null, "degraded reason");
        check(reply.getRaw().get("tandem") instanceof Map, "raw map");
    }

    private static void feedback(final TandemClient client) throws Exception {
        ChatCompletion reply = client.chat(shortRequest());
        check(client.feedback(reply.getId(), 1.0), "feedback on our own answer should be recorded");
        check(client.feedback(reply.getId(), 0.0), "a second verdict replaces the first");
        expect(NotFoundException.class, () -> client.feedback("chatcmpl-never-issued", 1.0));
        expect(InvalidRequestException.class, () -> client.feedback(reply.getId(), 2.0));
    }

    private static void embeddings(final TandemClient client) throws Exception {
        List<float[]> two = client.embeddings(Arrays.asList("A cat sat on the mat.", "Stock markets fell sharply."));
        checkEquals(Integer.valueOf(2), Integer.valueOf(two.size()), "one vector per text");
        checkEquals(Integer.valueOf(384), Integer.valueOf(two.get(0).length), "MiniLM's width");
        double norm = 0;
        for (float v : two.get(0)) {
            norm += v * v;
        }
        check(Math.abs(norm - 1.0) < 1e-3, "unit length: " + norm);
        float[] single = client.embedding("A cat sat on the mat.");
        for (int i = 0; i < single.length; i++) {
            check(Math.abs(single[i] - two.get(0)[i]) < 1e-5, "batched and single vectors agree at " + i);
        }
        expect(InvalidRequestException.class, () -> client.embedding(""));
    }

    private static void chatPrivate(TandemClient client) throws Exception {
        String odd = "Repeat: \"quotes\" back\\slash tab\t newline\n ctrl\u0001 caf\u00e9 \uD83D\uDE00";
        ChatCompletion reply = client.chat(ChatRequest.builder().user(odd).maxTokens(50).privateRequest(true)
                .seed(1).topP(0.9).stop(Arrays.asList("\n\n\n")).extra("max_tokens", Long.valueOf(3)).build());
        checkEquals("local", reply.getRouting().getTier(), "tier");
        checkEquals("private", reply.getRouting().getReason(), "reason for a private request");
        check(reply.getUsage().getCompletionTokens() <= 3, "extra max_tokens=3 ignored: " + reply.getUsage());
    }

    private static void invalidRequest(final TandemClient client) throws Exception {
        InvalidRequestException e = expect(InvalidRequestException.class,
                () -> client.chat(ChatRequest.builder().user("hi").temperature(5).build()));
        checkEquals("temperature", e.getParam(), "param");
        checkEquals(Integer.valueOf(400), Integer.valueOf(e.getHttpStatus()), "status");
        checkEquals("invalid_request_error", e.getType(), "type");
        check(e.getMessage() != null && e.getMessage().contains("temperature"), "message: " + e.getMessage());
    }

    private static void unknownModel(final TandemClient client) throws Exception {
        NotFoundException e = expect(NotFoundException.class,
                () -> client.chat(ChatRequest.builder().model("nope").user("hi").build()));
        checkEquals("model_not_found", e.getCode(), "code");
        checkEquals("model", e.getParam(), "param");
    }

    private static void wrongKey(String baseUrl) throws Exception {
        final TandemClient bad = new TandemClient(baseUrl, "sk-definitely-wrong");
        AuthenticationException e = expect(AuthenticationException.class, () -> bad.chat(shortRequest()));
        checkEquals(Integer.valueOf(401), Integer.valueOf(e.getHttpStatus()), "status");
        // The desktop JDK drops a 401's body on a streamed POST (see TandemClient.send); a GET keeps it.
        e = expect(AuthenticationException.class, () -> bad.listModels());
        checkEquals("invalid_api_key", e.getCode(), "code");
        check(e.getMessage().contains("Incorrect API key"), "server's message: " + e.getMessage());
        Recorder recorder = new Recorder();
        check(bad.stream(shortRequest(), recorder).await(30000), "stream with a wrong key should end");
        recorder.checkOneError(AuthenticationException.class);
        check(bad.health(), "health needs no key");
    }

    private static void missingKey(String baseUrl) throws Exception {
        final TandemClient none = new TandemClient(baseUrl, null);
        expect(AuthenticationException.class, () -> none.chat(shortRequest()));
        AuthenticationException e = expect(AuthenticationException.class, () -> none.listModels());
        checkEquals("invalid_api_key", e.getCode(), "code");
        Recorder recorder = new Recorder();
        check(none.stream(shortRequest(), recorder).await(30000), "stream without a key should end");
        recorder.checkOneError(AuthenticationException.class);
    }

    /** Records a stream's callbacks and checks the listener contract on each. */
    private static class Recorder implements StreamListener {
        final StringBuilder text = new StringBuilder();
        final AtomicInteger deltas = new AtomicInteger();
        final AtomicInteger completes = new AtomicInteger();
        final AtomicInteger errors = new AtomicInteger();
        final AtomicInteger afterTerminal = new AtomicInteger();
        final AtomicInteger onCallerThread = new AtomicInteger();
        final CountDownLatch firstDelta = new CountDownLatch(1);
        final Thread caller = Thread.currentThread();
        volatile ChatCompletion completion;
        volatile TandemException error;

        private void touch() {
            if (Thread.currentThread() == caller) {
                onCallerThread.incrementAndGet();
            }
            if (completes.get() + errors.get() > 0) {
                afterTerminal.incrementAndGet();
            }
        }

        @Override
        public void onDelta(String delta) {
            touch();
            check(delta != null && !delta.isEmpty(), "empty delta");
            synchronized (text) {
                text.append(delta);
            }
            deltas.incrementAndGet();
            firstDelta.countDown();
        }

        @Override
        public void onComplete(ChatCompletion c) {
            touch();
            completion = c;
            completes.incrementAndGet();
        }

        @Override
        public void onError(TandemException e) {
            touch();
            error = e;
            errors.incrementAndGet();
        }

        String text() {
            synchronized (text) {
                return text.toString();
            }
        }

        void checkContract() {
            checkEquals(Integer.valueOf(1), Integer.valueOf(completes.get() + errors.get()), "terminal calls");
            checkEquals(Integer.valueOf(0), Integer.valueOf(afterTerminal.get()), "callbacks after the terminal one");
            checkEquals(Integer.valueOf(0), Integer.valueOf(onCallerThread.get()), "callbacks on the caller's thread");
        }

        void checkOneError(Class<? extends TandemException> type) {
            checkContract();
            check(completes.get() == 0 && type.isInstance(error), "expected onError(" + type.getSimpleName()
                    + ") but got " + (error != null ? error : completion));
        }

        void checkCompleted() {
            checkContract();
            check(error == null, "onError: " + error);
            ChatCompletion c = completion;
            check(c != null, "no onComplete");
            checkEquals(text(), c.getContent(), "deltas vs onComplete content");
            check(deltas.get() > 0 && !c.getContent().isEmpty(), "no text streamed");
            check(c.getFinishReason() != null, "finish reason missing");
            check(c.getUsage() != null && c.getUsage().getCompletionTokens() > 0, "usage: " + c.getUsage());
            check(c.getRouting() != null, "routing missing");
            checkEquals("local", c.getRouting().getTier(), "routing tier");
            check(c.getId() != null && c.getId().startsWith("chatcmpl"), "id: " + c.getId());
        }
    }

    private static void stream(TandemClient client) throws Exception {
        Recorder recorder = new Recorder();
        StreamCall call = client.stream(shortRequest(), recorder);
        check(call.await(60000), "stream did not finish in 60 s");
        check(call.isDone() && !call.isCancelled(), "isDone/isCancelled");
        recorder.checkCompleted();
        check(!call.cancel(), "cancel() after completion should be a no-op");
        checkEquals(Integer.valueOf(1), Integer.valueOf(recorder.completes.get()), "onComplete count after cancel()");
    }

    private static void streamError(TandemClient client) throws Exception {
        Recorder recorder = new Recorder();
        StreamCall call = client.stream(ChatRequest.builder().user("hi").temperature(5).build(), recorder);
        check(call.await(30000), "did not finish");
        recorder.checkOneError(InvalidRequestException.class);
        checkEquals("temperature", recorder.error.getParam(), "param");
    }

    private static void cancelMidStream(TandemClient client) throws Exception {
        Recorder recorder = new Recorder();
        StreamCall call = client.stream(longRequest(), recorder);
        check(recorder.firstDelta.await(60, TimeUnit.SECONDS), "no first delta in 60 s");
        check(call.cancel(), "cancel() should return true mid-stream");
        int deltasAtCancel = recorder.deltas.get();
        long t0 = System.nanoTime();
        check(call.await(5000), "await() after cancel did not return in 5 s");
        long awaitMs = (System.nanoTime() - t0) / 1000000;
        check(awaitMs < 2000, "await() took " + awaitMs + " ms after cancel");
        Thread.sleep(300); // anything late would show up now
        recorder.checkOneError(CancelledException.class);
        checkEquals(Integer.valueOf(deltasAtCancel), Integer.valueOf(recorder.deltas.get()), "deltas after cancel()");
        check(call.isCancelled() && call.isDone(), "isCancelled/isDone");
        check(!call.cancel(), "second cancel() should return false");
        checkEquals(Integer.valueOf(1), Integer.valueOf(recorder.errors.get()), "onError count");
        check(recorder.error.getHttpStatus() == 0, "cancel has no status");
    }

    private static void cancelInsideListener(TandemClient client) throws Exception {
        final StreamCall[] holder = new StreamCall[1];
        final CountDownLatch started = new CountDownLatch(1);
        final AtomicInteger cancelResult = new AtomicInteger(-1);
        Recorder recorder = new Recorder() {
            @Override
            public void onDelta(String delta) {
                super.onDelta(delta);
                try {
                    started.await();
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                }
                if (cancelResult.get() < 0) {
                    cancelResult.set(holder[0].cancel() ? 1 : 0);
                }
            }
        };
        holder[0] = client.stream(longRequest(), recorder);
        started.countDown();
        check(holder[0].await(60000), "did not finish");
        checkEquals(Integer.valueOf(1), Integer.valueOf(cancelResult.get()), "cancel() inside onDelta");
        recorder.checkOneError(CancelledException.class);
        checkEquals(Integer.valueOf(1), Integer.valueOf(recorder.deltas.get()), "deltas");
    }

    private static void concurrentStreams(TandemClient client) throws Exception {
        ExecutorService pool = Executors.newFixedThreadPool(2);
        try {
            Recorder a = new Recorder();
            Recorder b = new Recorder();
            ChatRequest request = ChatRequest.builder().user("Count from one to ten in words.").maxTokens(40)
                    .temperature(0).build();
            StreamCall first = client.stream(request, a, pool);
            StreamCall second = client.stream(request, b);
            check(first.await(90000) && second.await(90000), "streams did not finish in 90 s");
            a.checkCompleted();
            b.checkCompleted();
            check(!a.completion.getId().equals(b.completion.getId()), "two streams, one id");
        } finally {
            pool.shutdownNow();
        }
    }

    private static void readTimeout(String baseUrl, String key) throws Exception {
        final TandemClient impatient = new TandemClient(baseUrl, key).setReadTimeoutMillis(200);
        long t0 = System.nanoTime();
        RequestTimeoutException e = expect(RequestTimeoutException.class, () -> impatient.chat(longRequest()));
        long ms = (System.nanoTime() - t0) / 1000000;
        check(ms < 3000, "timed out only after " + ms + " ms");
        check(e instanceof ConnectionException && e.getCause() != null, "a ConnectionException with a cause");
    }
}
