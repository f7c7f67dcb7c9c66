package dev.tandem.client;

import java.util.Collections;
import java.util.Map;

/**
 * How tandem answered: the top-level {@code tandem} object of a reply (in a stream, of the chunk that
 * carries the finish reason). {@link #getRaw()} holds the fields not mapped here (privacy reasons, cost).
 */
public final class Routing {
    private final String tier;
    private final boolean escalated;
    private final String reason;
    private final Double confidence;
    private final boolean degraded;
    private final String degradedReason;
    private final Map<String, Object> raw;

    private Routing(Map<String, Object> raw) {
        this.tier = Json.getString(raw, "tier");
        this.escalated = Json.getBoolean(raw, "escalated");
        this.reason = Json.getString(raw, "reason");
        this.confidence = Json.getDouble(raw, "confidence");
        this.degraded = Json.getBoolean(raw, "degraded");
        this.degradedReason = Json.getString(raw, "degraded_reason");
        this.raw = Collections.unmodifiableMap(raw);
    }

    static Routing fromJson(Map<String, Object> tandem) {
        return tandem == null ? null : new Routing(tandem);
    }

    /** {@code "local"} or {@code "cloud"}: where the answer was generated. */
    public String getTier() {
        return tier;
    }

    /** True when the answer started on the device and was handed to the cloud. */
    public boolean isEscalated() {
        return escalated;
    }

    /** Why it was routed so, e.g. {@code "confident"} or {@code "private"}. */
    public String getReason() {
        return reason;
    }

    /** The local model's confidence score when one was computed; null otherwise. */
    public Double getConfidence() {
        return confidence;
    }

    /** True when tandem fell back (e.g. the cloud was unreachable); see {@link #getDegradedReason()}. */
    public boolean isDegraded() {
        return degraded;
    }

    public String getDegradedReason() {
        return degradedReason;
    }

    public Map<String, Object> getRaw() {
        return raw;
    }

    @Override
    public String toString() {
        return "Routing{tier=" + tier + ", escalated=" + escalated + ", reason=" + reason + ", confidence=" + confidence
                + ", degraded=" + degraded + ", degradedReason=" + degradedReason + "}";
    }
}
