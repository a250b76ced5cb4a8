/*
 * error_documents.cpp — gd.instances.error, one shape for every way a step
 * fails: {"kind", "message", "step", "attempt"}, with "sqlstate" and
 * "detail" for an error raised, "worker" for an expired lease, and the
 * user's error object of gd_retry or gd_stop (its keys kept, its "message"
 * the message; a value that is not an object under "data").
 */
#include "error_documents.hpp"
#include "gen_durable.hpp"
#include "picker.hpp"

extern "C" {
#include "lib/stringinfo.h"
#include "utils/builtins.h"
#include "utils/json.h"
#include "utils/jsonb.h"
}

namespace {

void append_json_field(StringInfo json, const char *key, const char *value, bool first = false)
{
    if (!first)
        appendStringInfoString(json, ", ");
    escape_json(json, key);
    appendStringInfoString(json, ": ");
    if (value == nullptr)
        appendStringInfoString(json, "null");
    else
        escape_json(json, value);
}

} // namespace

Datum gd_error_document(const PickedInstance &row, const ErrorFields &fields, Datum given)
{
    Jsonb *user = given ? DatumGetJsonbP(given) : nullptr;
    bool user_object = user != nullptr && JB_ROOT_IS_OBJECT(user);
    const char *message = fields.message;
    if (user_object) {
        /* the user's own message, if the object has one */
        JsonbValue key{};
        key.type = jbvString;
        key.val.string.val = const_cast<char *>("message");
        key.val.string.len = 7;
        JsonbValue *own = findJsonbValueFromContainer(&user->root, JB_FOBJECT, &key);
        if (own != nullptr && own->type == jbvString)
            message = pnstrdup(own->val.string.val, own->val.string.len);
    }
    StringInfoData json;
    initStringInfo(&json);
    appendStringInfoChar(&json, '{');
    append_json_field(&json, "kind", fields.kind, true);
    append_json_field(&json, "message", message);
    if (fields.sqlstate != nullptr)
        append_json_field(&json, "sqlstate", fields.sqlstate);
    if (fields.sqlstate != nullptr || fields.detail != nullptr)
        append_json_field(&json, "detail", fields.detail);
    if (fields.worker != nullptr)
        append_json_field(&json, "worker", fields.worker);
    if (fields.hint != nullptr)
        append_json_field(&json, "hint", fields.hint);
    append_json_field(&json, "step", row.step);
    appendStringInfo(&json, ", \"attempt\": %d", row.attempt);
    if (user != nullptr && !user_object)
        appendStringInfo(&json, ", \"data\": %s", JsonbToCString(nullptr, &user->root, VARSIZE(user)));
    appendStringInfoChar(&json, '}');
    Datum document = DirectFunctionCall1(jsonb_in, CStringGetDatum(json.data));
    pfree(json.data);
    /* the user's other keys stay; the engine's win */
    return user_object ? DirectFunctionCall2(jsonb_concat, given, document) : document;
}

Datum gd_error_json(const ErrorData *edata, const PickedInstance &row)
{
    /* A cancel that reaches here is the step's own timeout: the runner rethrows any other. */
    ErrorFields fields{edata->sqlerrcode == ERRCODE_QUERY_CANCELED ? "timeout" : "error", edata->message};
    fields.sqlstate = unpack_sql_state(edata->sqlerrcode);
    fields.detail = edata->detail;
    fields.hint = edata->hint;
    /* A handler whose own SET search_path leaves the API's schema out finds no gd_next. */
    if (edata->sqlerrcode == ERRCODE_UNDEFINED_FUNCTION && edata->message != nullptr &&
        strstr(edata->message, "function gd_") != nullptr)
        fields.hint = "The handler does not find gen_durable's API: its own SET search_path must name the API's "
                      "schema too (SET search_path = shop, public), or it must qualify the calls (public.gd_next).";
    return gd_error_document(row, fields);
}
