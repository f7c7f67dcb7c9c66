package dev.tandem.client;

import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * Folds {@code chat.completion.chunk}s into the equivalent {@code chat.completion}: the text of every
 * {@code choices[0].delta.content}, the finish reason of the chunk that has one, {@code tandem} from the
 * chunk that carries it and {@code usage} from the usage chunk. One per stream, on its worker thread.
 */
final class StreamAssembler {
    private final StringBuilder content = new StringBuilder();
    private String id;
    private String model;
    private Object created;
    private String finishReason;
    private Map<String, Object> usage;
    private Map<String, Object> tandem;

    /** Takes one chunk; returns its text delta (null or empty when it has none). */
    String add(Map<String, Object> chunk) {
        if (id == null) {
            id = Json.getString(chunk, "id");
        }
        if (model == null) {
            model = Json.getString(chunk, "model");
        }
        if (created == null) {
            created = chunk.get("created");
        }
        Map<String, Object> u = Json.getMap(chunk, "usage");
        if (u != null) {
            usage = u;
        }
        Map<String, Object> t = Json.getMap(chunk, "tandem");
        if (t != null) {
            tandem = t;
        }
        Map<String, Object> choice = Json.firstChoice(chunk);
        if (choice == null) {
            return null;
        }
        String reason = Json.getString(choice, "finish_reason");
        if (reason != null) {
            finishReason = reason;
        }
        String text = Json.getString(Json.getMap(choice, "delta"), "content");
        if (text != null) {
            content.append(text);
        }
        return text;
    }

    ChatCompletion build() {
        Map<String, Object> message = new LinkedHashMap<String, Object>();
        message.put("role", "assistant");
        message.put("content", content.toString());
        Map<String, Object> choice = new LinkedHashMap<String, Object>();
        choice.put("index", Long.valueOf(0));
        choice.put("message", message);
        choice.put("finish_reason", finishReason);
        List<Object> choices = new ArrayList<Object>();
        choices.add(choice);
        Map<String, Object> whole = new LinkedHashMap<String, Object>();
        whole.put("id", id);
        whole.put("object", "chat.completion");
        whole.put("created", created);
        whole.put("model", model);
        whole.put("choices", choices);
        whole.put("usage", usage);
        whole.put("tandem", tandem);
        try {
            return ChatCompletion.fromJson(whole);
        } catch (Json.ParseException impossible) {
            throw new IllegalStateException(impossible); // the message is always there
        }
    }
}
