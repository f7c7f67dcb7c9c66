package dev.tandem.client;

import java.util.ArrayList;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * One chat completion request: an immutable value made with {@link #builder()}, safe to share between
 * threads and to send more than once.
 *
 * <pre>{@code
 * ChatRequest request = ChatRequest.builder()
 *         .system("You are terse.")
 *         .user("Name three rivers.")
 *         .maxTokens(64)
 *         .temperature(0.2)
 *         .privateRequest(true)   // tandem: never leave the device
 *         .build();
 * }</pre>
 */
public final class ChatRequest {
    /** One chat message: a role ({@code "system"}, {@code "user"}, {@code "assistant"}, ...) and its text. */
    public static final class Message {
        private final String role;
        private final String content;
        private final List<ToolCall> toolCalls;
        private final String toolCallId;

        public Message(String role, String content) {
            this(role, content, Collections.<ToolCall>emptyList(), null);
            if (content == null) {
                throw new IllegalArgumentException("a message needs a role and a content");
            }
        }

        private Message(String role, String content, List<ToolCall> toolCalls, String toolCallId) {
            if (role == null) {
                throw new IllegalArgumentException("a message needs a role");
            }
            this.role = role;
            this.content = content;
            this.toolCalls = Collections.unmodifiableList(new ArrayList<ToolCall>(toolCalls));
            this.toolCallId = toolCallId;
        }

        /** An earlier assistant turn that asked for these calls (its {@link ChatCompletion#getToolCalls()}). */
        public static Message assistantToolCalls(List<ToolCall> calls) {
            if (calls == null || calls.isEmpty()) {
                throw new IllegalArgumentException("an assistant tool-call turn needs at least one call");
            }
            return new Message("assistant", null, calls, null);
        }

        /** A call's result: role {@code "tool"}, with the call's id. */
        public static Message toolResult(String toolCallId, String content) {
            if (toolCallId == null || content == null) {
                throw new IllegalArgumentException("a tool result needs the call's id and a content");
            }
            return new Message("tool", content, Collections.<ToolCall>emptyList(), toolCallId);
        }

        public String getRole() {
            return role;
        }

        /** Null only for an assistant turn that is only tool calls. */
        public String getContent() {
            return content;
        }

        public List<ToolCall> getToolCalls() {
            return toolCalls;
        }

        public String getToolCallId() {
            return toolCallId;
        }
    }

    private final String model;
    private final List<Message> messages;
    private final Integer maxTokens;
    private final Double temperature;
    private final Double topP;
    private final Long seed;
    private final List<String> stop;
    private final Boolean privateRequest;
    private final Map<String, Object> extra;

    private ChatRequest(Builder b) {
        this.model = b.model;
        this.messages = Collections.unmodifiableList(new ArrayList<Message>(b.messages));
        this.maxTokens = b.maxTokens;
        this.temperature = b.temperature;
        this.topP = b.topP;
        this.seed = b.seed;
        this.stop = b.stop == null ? null : Collections.unmodifiableList(new ArrayList<String>(b.stop));
        this.privateRequest = b.privateRequest;
        this.extra = Collections.unmodifiableMap(new LinkedHashMap<String, Object>(b.extra));
    }

    public static Builder builder() {
        return new Builder();
    }

    /** A builder pre-filled with this request's fields, to derive a variant. */
    public Builder toBuilder() {
        Builder b = new Builder();
        b.model = model;
        b.messages.addAll(messages);
        b.maxTokens = maxTokens;
        b.temperature = temperature;
        b.topP = topP;
        b.seed = seed;
        b.stop = stop == null ? null : new ArrayList<String>(stop);
        b.privateRequest = privateRequest;
        b.extra.putAll(extra);
        return b;
    }

    public String getModel() {
        return model;
    }

    public List<Message> getMessages() {
        return messages;
    }

    /** Null when unset (the server's default applies); likewise for the other optional fields. */
    public Integer getMaxTokens() {
        return maxTokens;
    }

    public Double getTemperature() {
        return temperature;
    }

    public Double getTopP() {
        return topP;
    }

    public Long getSeed() {
        return seed;
    }

    public List<String> getStop() {
        return stop;
    }

    public Boolean getPrivateRequest() {
        return privateRequest;
    }

    public Map<String, Object> getExtra() {
        return extra;
    }

    /** The OpenAI request body (without {@code stream}); extra fields come last and win over typed ones. */
    public Map<String, Object> toBody() {
        Map<String, Object> body = new LinkedHashMap<String, Object>();
        body.put("model", model);
        List<Object> wire = new ArrayList<Object>();
        for (Message m : messages) {
            Map<String, Object> one = new LinkedHashMap<String, Object>();
            one.put("role", m.getRole());
            one.put("content", m.getContent());
            if (!m.getToolCalls().isEmpty()) {
                List<Object> calls = new ArrayList<Object>();
                for (ToolCall call : m.getToolCalls()) {
                    calls.add(call.toJson());
                }
                one.put("tool_calls", calls);
            }
            if (m.getToolCallId() != null) {
                one.put("tool_call_id", m.getToolCallId());
            }
            wire.add(one);
        }
        body.put("messages", wire);
        putIfSet(body, "max_tokens", maxTokens);
        putIfSet(body, "temperature", temperature);
        putIfSet(body, "top_p", topP);
        putIfSet(body, "seed", seed);
        putIfSet(body, "stop", stop);
        putIfSet(body, "private", privateRequest);
        body.putAll(extra);
        return body;
    }

    /** {@link #toBody()} as JSON text. */
    public String toJson() {
        return Json.write(toBody());
    }

    private static void putIfSet(Map<String, Object> body, String key, Object value) {
        if (value != null) {
            body.put(key, value);
        }
    }

    /** Not thread-safe (build on one thread); {@link #build()} gives the immutable request. */
    public static final class Builder {
        private String model = "auto";
        private final List<Message> messages = new ArrayList<Message>();
        private Integer maxTokens;
        private Double temperature;
        private Double topP;
        private Long seed;
        private List<String> stop;
        private Boolean privateRequest;
        private final Map<String, Object> extra = new LinkedHashMap<String, Object>();

        private Builder() {
        }

        /** {@code "auto"} (the default: tandem routes), {@code "local"}, {@code "cloud"} or a model's name. */
        public Builder model(String model) {
            if (model == null) {
                throw new IllegalArgumentException("model must not be null");
            }
            this.model = model;
            return this;
        }

        public Builder message(String role, String content) {
            messages.add(new Message(role, content));
            return this;
        }

        public Builder messages(List<Message> all) {
            for (Message m : all) {
                if (m == null) {
                    throw new IllegalArgumentException("null message");
                }
                messages.add(m);
            }
            return this;
        }

        public Builder system(String content) {
            return message("system", content);
        }

        public Builder user(String content) {
            return message("user", content);
        }

        public Builder assistant(String content) {
            return message("assistant", content);
        }

        public Builder maxTokens(int maxTokens) {
            this.maxTokens = Integer.valueOf(maxTokens);
            return this;
        }

        public Builder temperature(double temperature) {
            this.temperature = Double.valueOf(temperature);
            return this;
        }

        public Builder topP(double topP) {
            this.topP = Double.valueOf(topP);
            return this;
        }

        public Builder seed(long seed) {
            this.seed = Long.valueOf(seed);
            return this;
        }

        public Builder stop(List<String> stop) {
            this.stop = stop == null ? null : new ArrayList<String>(stop);
            return this;
        }

        public Builder stop(String... stop) {
            List<String> list = new ArrayList<String>();
            Collections.addAll(list, stop);
            return stop(list);
        }

        /** tandem's {@code "private": true}: the request is answered on the device and never sent to a cloud. */
        public Builder privateRequest(boolean privateRequest) {
            this.privateRequest = Boolean.valueOf(privateRequest);
            return this;
        }

        /**
         * OpenAI's {@code tools}: each {@code {"type": "function", "function": {"name", "description",
         * "parameters"}}} (parameters: a JSON Schema as nested Maps and Lists). The reply's
         * {@link ChatCompletion#getToolCalls()} carries the calls the model asked for.
         */
        public Builder tools(List<Map<String, Object>> tools) {
            return extra("tools", tools == null ? null : new ArrayList<Object>(tools));
        }

        /** {@code "none"}, {@code "auto"}, {@code "required"}, or a function's name (that function must be called). */
        public Builder toolChoice(String choice) {
            if (choice == null || "none".equals(choice) || "auto".equals(choice) || "required".equals(choice)) {
                return extra("tool_choice", choice);
            }
            Map<String, Object> function = new LinkedHashMap<String, Object>();
            function.put("name", choice);
            Map<String, Object> named = new LinkedHashMap<String, Object>();
            named.put("type", "function");
            named.put("function", function);
            return extra("tool_choice", named);
        }

        /** OpenAI's {@code response_format}, e.g. {@code {"type": "json_schema", "json_schema": {"name", "schema"}}}. */
        public Builder responseFormat(Map<String, Object> format) {
            return extra("response_format", format == null ? null : new LinkedHashMap<String, Object>(format));
        }

        /**
         * Any other body field, sent as is: a value {@link Json#write} accepts (String, Number, Boolean,
         * null, Map, List). It overrides a typed field of the same name, but {@code stream} is always
         * set by the client.
         */
        public Builder extra(String key, Object value) {
            if (key == null) {
                throw new IllegalArgumentException("key must not be null");
            }
            Json.write(value); // fail here, on the caller's thread, for a value JSON cannot hold
            extra.put(key, value);
            return this;
        }

        public ChatRequest build() {
            if (messages.isEmpty()) {
                throw new IllegalStateException("a chat request needs at least one message");
            }
            return new ChatRequest(this);
        }
    }
}
