package dev.tandem.client;

import java.util.Collections;
import java.util.List;
import java.util.Map;

/**
 * A finished chat completion: from {@link TandemClient#chat}, or assembled from a stream for
 * {@link StreamListener#onComplete}. For a stream, {@link #getRaw()} is the equivalent non-streaming
 * reply ({@code object: "chat.completion"}) built from the chunks.
 */
public final class ChatCompletion {
    private final String id;
    private final String model;
    private final String content;
    private final List<ToolCall> toolCalls;
    private final String finishReason;
    private final Usage usage;
    private final Routing routing;
    private final Map<String, Object> raw;

    private ChatCompletion(Map<String, Object> raw) {
        this.raw = Collections.unmodifiableMap(raw);
        this.id = Json.getString(raw, "id");
        this.model = Json.getString(raw, "model");
        Map<String, Object> choice = Json.firstChoice(raw);
        this.content = Json.getString(Json.getMap(choice, "message"), "content");
        this.toolCalls = ToolCall.listFromJson(Json.getMap(choice, "message"));
        this.finishReason = Json.getString(choice, "finish_reason");
        this.usage = Usage.fromJson(Json.getMap(raw, "usage"));
        this.routing = Routing.fromJson(Json.getMap(raw, "tandem"));
    }

    /** Reads a parsed {@code chat.completion} body; a body without {@code choices[0].message} is rejected. */
    static ChatCompletion fromJson(Map<String, Object> body) throws Json.ParseException {
        if (Json.getMap(Json.firstChoice(body), "message") == null) {
            throw new Json.ParseException("reply has no choices[0].message", 0);
        }
        return new ChatCompletion(body);
    }

    public String getId() {
        return id;
    }

    public String getModel() {
        return model;
    }

    /** {@code choices[0].message.content}; null if the server sent null (an answer that is only tool calls). */
    public String getContent() {
        return content;
    }

    /** The functions the model asked to call (finish reason {@code "tool_calls"}); empty when none. */
    public List<ToolCall> getToolCalls() {
        return toolCalls;
    }

    /** {@code "stop"}, {@code "length"}, {@code "tool_calls"}, ...; null if the server sent none. */
    public String getFinishReason() {
        return finishReason;
    }

    /** Token counts; null if the server sent none. */
    public Usage getUsage() {
        return usage;
    }

    /** tandem's routing record; null when the server is not tandem (or sent none). */
    public Routing getRouting() {
        return routing;
    }

    public Map<String, Object> getRaw() {
        return raw;
    }

    @Override
    public String toString() {
        return "ChatCompletion{id=" + id + ", model=" + model + ", finishReason=" + finishReason + ", usage=" + usage
                + ", routing=" + routing + ", content=" + content + ", toolCalls=" + toolCalls + "}";
    }
}
