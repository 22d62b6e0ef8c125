#include "cc/config/optimizer_from_proto.h"

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/unknown_field_set.h"

namespace tf_embed_ops {
namespace {

namespace pb = ::google::protobuf;
namespace tpu = ::tensorflow::tpu;

// Algorithms of the proto that tf_embed_ops does not run, with the reason the error gives.
struct NotImplemented {
  const char* kind;
  const char* reason;
};
constexpr NotImplemented kNotImplemented[] = {
    {"mdl_adagrad_light", "its update rule is not public"},
    {"frequency_aware_adagrad",
     "the proto's description of its update is garbled (it multiplies by the gradient twice) and no implementation "
     "is public, so any reading could silently differ from TPU"},
    {"user_defined_program",
     "it is an XLA HLO program, and TensorFlow's CPU package offers custom ops no HLO interpreter to run it"},
};

absl::Status UnimplementedError(std::string_view kind, const std::string& ctx) {
  for (const NotImplemented& n : kNotImplemented) {
    if (kind == n.kind) {
      return absl::UnimplementedError(
          absl::StrCat(ctx, ": optimizer '", kind, "' is not implemented by tf_embed_ops: ", n.reason));
    }
  }
  return absl::UnimplementedError(absl::StrCat(ctx, ": optimizer '", kind, "' is not implemented by tf_embed_ops"));
}

absl::Status NotSetError(const std::string& ctx) {
  std::vector<std::string_view> kinds;
  for (const OptimizerSchema& s : kOptimizerSchemas) kinds.push_back(s.kind);
  return absl::InvalidArgumentError(absl::StrCat(
      ctx, ": no optimization algorithm specified (optimization_parameters.parameters is not set; expected one of ",
      absl::StrJoin(kinds, ", "), ")"));
}

// The frequency estimator takes the global step as its learning rate (TPUEstimator passed float(global_step)); a
// constant would freeze the estimate's clock.
absl::Status CheckLearningRate(const OptimizerSchema& schema, const tpu::OptimizationParameters& params,
                               const std::string& ctx) {
  if (!schema.needs_dynamic_learning_rate || params.learning_rate().has_dynamic()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(ctx, ": ", schema.kind,
                                                 " takes the current global step as its learning rate, so "
                                                 "optimization_parameters.learning_rate must be dynamic (a tag), "
                                                 "got constant ",
                                                 params.learning_rate().constant()));
}

absl::Status CheckRange(const OptimizerSchema& schema, const HyperParameterSpec& spec, float value,
                        const std::string& ctx) {
  if (spec.range.Contains(value)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(ctx, ": optimization_parameters.", schema.kind, ".", spec.proto_name,
                                                 " must be ", spec.range.Describe(), ", got ", value));
}

// The optimizer message's fields in schema order (bools as 0/1), each checked against its range.  The schema
// names every field; one the message lacks is a schema bug, reported as Internal.
absl::Status ReadHyperParameters(const OptimizerSchema& schema, const pb::Message& message, const std::string& ctx,
                                 std::vector<float>* values) {
  const pb::Descriptor* descriptor = message.GetDescriptor();
  const pb::Reflection* reflection = message.GetReflection();
  for (const HyperParameterSpec& spec : schema.hyper_parameters) {
    const pb::FieldDescriptor* field = descriptor->FindFieldByName(spec.proto_name);
    const auto expected =
        spec.type == ValueType::kFloat ? pb::FieldDescriptor::CPPTYPE_FLOAT : pb::FieldDescriptor::CPPTYPE_BOOL;
    if (field == nullptr || field->cpp_type() != expected || field->is_repeated()) {
      return absl::InternalError(absl::StrCat(ctx, ": the optimizer schema names field ", schema.kind, ".",
                                              spec.proto_name, ", which ", descriptor->full_name(),
                                              " does not have with that type"));
    }
    if (spec.type == ValueType::kBool) {
      values->push_back(reflection->GetBool(message, field) ? 1.0f : 0.0f);
      continue;
    }
    const float value = reflection->GetFloat(message, field);
    if (auto s = CheckRange(schema, spec, value, ctx); !s.ok()) return s;
    values->push_back(value);
  }
  return absl::OkStatus();
}

// The schema of the optimizer an extension field of `params` carries (schema.h, extension_field), with that field's
// payload; nullptr when there is none.  Two such fields, or one next to the algorithm oneof, are refused.
absl::Status FindExtension(const tpu::OptimizationParameters& params, const std::string& ctx,
                           const OptimizerSchema** schema, std::string* payload) {
  *schema = nullptr;
  const pb::UnknownFieldSet& unknown = params.GetReflection()->GetUnknownFields(params);
  for (int i = 0; i < unknown.field_count(); ++i) {
    const pb::UnknownField& field = unknown.field(i);
    const OptimizerSchema* found = nullptr;
    for (const OptimizerSchema& s : kOptimizerSchemas) {
      if (s.extension_field != 0 && s.extension_field == field.number()) found = &s;
    }
    if (found == nullptr) continue;
    if (field.type() != pb::UnknownField::TYPE_LENGTH_DELIMITED) {
      return absl::InvalidArgumentError(absl::StrCat(ctx, ": optimization_parameters field ", field.number(), " (",
                                                     found->kind, ") must be a length-delimited message"));
    }
    if (*schema != nullptr || params.parameters_case() != tpu::OptimizationParameters::PARAMETERS_NOT_SET) {
      return absl::InvalidArgumentError(
          absl::StrCat(ctx, ": optimization_parameters sets ", found->kind, " (field ", field.number(),
                       ") and another optimization algorithm, or sets it twice; a table has exactly one optimizer"));
    }
    *schema = found;
    *payload = field.length_delimited();
  }
  return absl::OkStatus();
}

// The payload of an extension field: field i + 1 is hyper_parameters[i] (float: fixed32, bool: varint), absent
// fields are 0 / false as in proto3, and a repeated field's last value wins as in protobuf.
absl::Status ReadExtensionHyperParameters(const OptimizerSchema& schema, const std::string& payload,
                                          const std::string& ctx, std::vector<float>* values) {
  values->assign(schema.hyper_parameters.size, 0.0f);
  const std::string where =
      absl::StrCat(ctx, ": optimization_parameters.", schema.kind, " (field ", schema.extension_field, ")");
  size_t pos = 0;
  auto varint = [&](uint64_t* out) {
    uint64_t v = 0;
    for (int shift = 0; shift < 64 && pos < payload.size(); shift += 7) {
      const uint8_t byte = static_cast<uint8_t>(payload[pos++]);
      v |= static_cast<uint64_t>(byte & 0x7F) << shift;
      if ((byte & 0x80) == 0) {
        *out = v;
        return true;
      }
    }
    return false;
  };
  while (pos < payload.size()) {
    uint64_t tag = 0;
    if (!varint(&tag)) return absl::InvalidArgumentError(absl::StrCat(where, ": truncated field tag"));
    const uint64_t number = tag >> 3;
    const int wire_type = static_cast<int>(tag & 7);
    if (number < 1 || number > schema.hyper_parameters.size) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": unknown field number ", number, " (it has fields 1 to ",
                                                     schema.hyper_parameters.size, ")"));
    }
    const HyperParameterSpec& spec = schema.hyper_parameters[number - 1];
    if (spec.type == ValueType::kFloat) {
      if (wire_type != 5 || payload.size() - pos < 4) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": field ", number, " (", spec.proto_name, ") must be a float (fixed32)"));
      }
      uint32_t bits = 0;
      for (int b = 0; b < 4; ++b) bits |= static_cast<uint32_t>(static_cast<uint8_t>(payload[pos + b])) << (8 * b);
      pos += 4;
      float value;
      static_assert(sizeof(value) == sizeof(bits), "float is 32 bits");
      std::memcpy(&value, &bits, sizeof(value));
      (*values)[number - 1] = value;
    } else {
      uint64_t v = 0;
      if (wire_type != 0 || !varint(&v)) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": field ", number, " (", spec.proto_name, ") must be a bool (varint)"));
      }
      (*values)[number - 1] = v != 0 ? 1.0f : 0.0f;
    }
  }
  for (size_t i = 0; i < schema.hyper_parameters.size; ++i) {
    const HyperParameterSpec& spec = schema.hyper_parameters[i];
    if (spec.type != ValueType::kFloat) continue;
    if (auto s = CheckRange(schema, spec, (*values)[i], ctx); !s.ok()) return s;
  }
  return absl::OkStatus();
}

// The struct's members, in schema order (`values` is index-aligned with schema.hyper_parameters, which
// registry.h checks against the struct's HyperParameters() when it compiles).  Members are written through the
// const references that ForEachHyperParameter hands out: `o` is a non-const local, so the const_cast is well
// defined, and the math header stays the only list of its struct's fields.
template <typename Optimizer>
absl::Status Build(const OptimizerSchema& schema, const std::vector<float>& values, const std::string& ctx,
                   OptimizerParams* out) {
  if (values.size() != schema.hyper_parameters.size) {
    return absl::InternalError(absl::StrCat(ctx, ": ", values.size(), " hyper-parameter values for the ",
                                            schema.hyper_parameters.size, " of ", schema.kind));
  }
  Optimizer o{};
  size_t i = 0;
  ForEachHyperParameter(o, [&](const char* /*name*/, const auto& member) {
    using T = std::decay_t<decltype(member)>;
    const_cast<T&>(member) = static_cast<T>(values[i++]);
  });
  *out = o;
  return absl::OkStatus();
}

using BuildFn = absl::Status (*)(const OptimizerSchema&, const std::vector<float>&, const std::string&,
                                 OptimizerParams*);

template <size_t... I>
constexpr std::array<BuildFn, sizeof...(I)> MakeBuilders(std::index_sequence<I...>) {
  return {&Build<std::variant_alternative_t<I, OptimizerParams>>...};
}
// Index-aligned with kOptimizerSchemas (both follow OptimizerParams).
constexpr auto kBuilders = MakeBuilders(std::make_index_sequence<std::variant_size_v<OptimizerParams>>{});

}  // namespace

absl::Status OptimizerFromProto(const tpu::OptimizationParameters& params, const std::string& context,
                                OptimizerParams* out) {
  const OptimizerSchema* extension = nullptr;
  std::string payload;
  if (auto s = FindExtension(params, context, &extension, &payload); !s.ok()) return s;
  if (extension != nullptr) {
    if (auto s = CheckLearningRate(*extension, params, context); !s.ok()) return s;
    std::vector<float> values;
    if (auto s = ReadExtensionHyperParameters(*extension, payload, context, &values); !s.ok()) return s;
    return kBuilders[static_cast<size_t>(extension - kOptimizerSchemas.data())](*extension, values, context, out);
  }
  if (params.parameters_case() == tpu::OptimizationParameters::PARAMETERS_NOT_SET) return NotSetError(context);
  // Name the algorithm by its proto field, which is what the user wrote in a .pbtxt.
  const pb::FieldDescriptor* field =
      params.GetDescriptor()->FindFieldByNumber(static_cast<int>(params.parameters_case()));
  if (field == nullptr) {
    return absl::UnimplementedError(absl::StrCat(context, ": optimizer field ",
                                                 static_cast<int>(params.parameters_case()),
                                                 " is not implemented by tf_embed_ops"));
  }
  const OptimizerSchema* schema = FindOptimizerSchema(field->name());
  if (schema == nullptr) return UnimplementedError(field->name(), context);

  if (auto s = CheckLearningRate(*schema, params, context); !s.ok()) return s;
  std::vector<float> values;
  const pb::Message& message = params.GetReflection()->GetMessage(params, field);
  if (auto s = ReadHyperParameters(*schema, message, context, &values); !s.ok()) return s;
  const size_t index = static_cast<size_t>(schema - kOptimizerSchemas.data());
  return kBuilders[index](*schema, values, context, out);
}

absl::Status CheckOptimizerAccumulation(const OptimizerParams& optimizer, bool gradient_accumulation,
                                        const std::string& context) {
  const OptimizerSchema& schema = SchemaFor(optimizer);
  const AccumulationRule& rule = schema.accumulation;
  if (gradient_accumulation || (!rule.always && rule.when_set == nullptr)) return absl::OkStatus();
  bool triggered = rule.always;
  if (rule.when_set != nullptr) {
    std::visit(
        [&](const auto& o) {
          ForEachHyperParameter(o, [&](const char* name, auto value) {
            if constexpr (std::is_same_v<decltype(value), bool>) {
              if (std::string_view(name) == rule.when_set && value) triggered = true;
            }
          });
        },
        optimizer);
  }
  if (!triggered) return absl::OkStatus();
  const std::string what = rule.always
                               ? absl::StrCat("optimization_parameters.", schema.kind, " is set")
                               : absl::StrCat("optimization_parameters.", schema.kind, ".", rule.when_set, " is true");
  return absl::InvalidArgumentError(
      absl::StrCat(context, ": ", what, " but gradient_accumulation_status is DISABLED; ", rule.reason));
}

}  // namespace tf_embed_ops
