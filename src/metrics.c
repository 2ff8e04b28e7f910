/* metrics: label names and (later) the Prometheus exposition.  See include/metrics.h. */
#include "metrics.h"

#define KVB_STR_ITEM(s, str) str,

const char *kvb_tier_name(int tier)
{
    static const char *names[] = {KVB_TIERS(KVB_STR_ITEM)};
    return tier >= 0 && tier < KVB_TIER__COUNT ? names[tier] : "device";
}

const char *kvb_drop_reason_name(int reason)
{
    static const char *names[] = {KVB_DROP_REASONS(KVB_STR_ITEM)};
    return reason >= 0 && reason < KVB_DROP__COUNT ? names[reason] : "unknown";
}
