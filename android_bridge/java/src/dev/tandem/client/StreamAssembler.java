package dev.tandem.client;

import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;

/**
 * Folds {@code chat.completion.chunk}s into the equivalent {@code chat.completion}: the text of every
 * {@code choices[0].delta.content}, the calls of every {@code delta.tool_calls} (by index: id and name
 * from the first piece, the arguments' pieces joined, as OpenAI streams them), the finish reason of the
 * chunk that has one, {@code tandem} from the chunk that carries it and {@code usage} from the usage
 * chunk. One per stream, on its worker thread.
 */
final class StreamAssembler {
    private final StringBuilder content = new StringBuilder();
    private final Map<Long, String[]> calls = new TreeMap<Long, String[]>(); // index -> {id, name, arguments}
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
        Map<String, Object> delta = Json.getMap(choice, "delta");
        addToolCalls(Json.getList(delta, "tool_calls"));
        String text = Json.getString(delta, "content");
        if (text != null) {
            content.append(text);
        }
        return text;
    }

    private void addToolCalls(List<Object> pieces) {
        if (pieces == null) {
            return;
        }
        for (Object item : pieces) {
            if (!(item instanceof Map)) {
                continue;
            }
            @SuppressWarnings("unchecked")
            Map<String, Object> piece = (Map<String, Object>) item;
            Long index = Json.getLong(piece, "index");
            Map<String, Object> function = Json.getMap(piece, "function");
            String[] call = calls.get(index);
            if (call == null) {
                call = new String[] {Json.getString(piece, "id"), Json.getString(function, "name"), ""};
                calls.put(index, call);
            }
            String arguments = Json.getString(function, "arguments");
            if (arguments != null) {
                call[2] += arguments;
            }
        }
    }

    /** The calls assembled so far, as they would appear in {@code message.tool_calls}. */
    List<ToolCall> toolCalls() {
        List<ToolCall> out = new ArrayList<ToolCall>();
        for (String[] call : calls.values()) {
            if (call[0] != null && call[1] != null) {
                out.add(new ToolCall(call[0], call[1], call[2]));
            }
        }
        return out;
    }

    ChatCompletion build() {
        Map<String, Object> message = new LinkedHashMap<String, Object>();
        message.put("role", "assistant");
        List<ToolCall> toolCalls = toolCalls();
        message.put("content", toolCalls.isEmpty() || content.length() > 0 ? content.toString() : null);
        if (!toolCalls.isEmpty()) {
            List<Object> wire = new ArrayList<Object>();
            for (ToolCall call : toolCalls) {
                wire.add(call.toJson());
            }
            message.put("tool_calls", wire);
        }
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
