package dev.tandem.client;

import java.util.ArrayList;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/** One function call the model asked for ({@code message.tool_calls[i]}): run it, then send its result back. */
public final class ToolCall {
    private final String id;
    private final String name;
    private final String arguments;

    public ToolCall(String id, String name, String arguments) {
        if (id == null || name == null || arguments == null) {
            throw new IllegalArgumentException("a tool call needs an id, a name and arguments");
        }
        this.id = id;
        this.name = name;
        this.arguments = arguments;
    }

    /** {@code call_...}: send it back as the result message's {@code tool_call_id}. */
    public String getId() {
        return id;
    }

    public String getName() {
        return name;
    }

    /** The arguments as JSON text (an object fitting the function's parameters). */
    public String getArguments() {
        return arguments;
    }

    Map<String, Object> toJson() {
        Map<String, Object> function = new LinkedHashMap<String, Object>();
        function.put("name", name);
        function.put("arguments", arguments);
        Map<String, Object> call = new LinkedHashMap<String, Object>();
        call.put("id", id);
        call.put("type", "function");
        call.put("function", function);
        return call;
    }

    /** The calls of a {@code message} object (empty when it has none); malformed entries are skipped. */
    static List<ToolCall> listFromJson(Map<String, Object> message) {
        Object raw = message == null ? null : message.get("tool_calls");
        if (!(raw instanceof List)) {
            return Collections.emptyList();
        }
        List<ToolCall> calls = new ArrayList<ToolCall>();
        for (Object item : (List<?>) raw) {
            if (!(item instanceof Map)) {
                continue;
            }
            @SuppressWarnings("unchecked")
            Map<String, Object> call = (Map<String, Object>) item;
            Map<String, Object> function = Json.getMap(call, "function");
            String id = Json.getString(call, "id");
            String name = Json.getString(function, "name");
            String arguments = Json.getString(function, "arguments");
            if (id != null && name != null && arguments != null) {
                calls.add(new ToolCall(id, name, arguments));
            }
        }
        return Collections.unmodifiableList(calls);
    }

    @Override
    public String toString() {
        return "ToolCall{id=" + id + ", name=" + name + ", arguments=" + arguments + "}";
    }
}
