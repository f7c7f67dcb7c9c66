package dev.tandem.client;

import java.util.Map;

/** Token counts of one completion (OpenAI's {@code usage}). */
public final class Usage {
    private final long promptTokens;
    private final long completionTokens;
    private final long totalTokens;

    public Usage(long promptTokens, long completionTokens, long totalTokens) {
        this.promptTokens = promptTokens;
        this.completionTokens = completionTokens;
        this.totalTokens = totalTokens;
    }

    static Usage fromJson(Map<String, Object> usage) {
        if (usage == null) {
            return null;
        }
        Long prompt = Json.getLong(usage, "prompt_tokens");
        Long completion = Json.getLong(usage, "completion_tokens");
        Long total = Json.getLong(usage, "total_tokens");
        long p = prompt == null ? 0 : prompt.longValue();
        long c = completion == null ? 0 : completion.longValue();
        return new Usage(p, c, total == null ? p + c : total.longValue());
    }

    public long getPromptTokens() {
        return promptTokens;
    }

    public long getCompletionTokens() {
        return completionTokens;
    }

    public long getTotalTokens() {
        return totalTokens;
    }

    @Override
    public String toString() {
        return "Usage{prompt=" + promptTokens + ", completion=" + completionTokens + ", total=" + totalTokens + "}";
    }
}
