//! Tests of the expansion function itself: snapshots of the generated code (prettyplease +
//! insta), and malformed input that must produce errors, never a panic.

use proc_macro2::TokenStream;

use crate::expand::{expand, expand_with_errors};

fn tokens(s: &str) -> TokenStream {
    s.parse().unwrap_or_else(|e| panic!("test input does not tokenize: {e}\n{s}"))
}

fn pretty(ts: TokenStream) -> String {
    let file: syn::File = syn::parse2(ts).expect("expansion parses as a file");
    prettyplease::unparse(&file)
}

fn settings() -> insta::Settings {
    let mut s = insta::Settings::clone_current();
    s.set_snapshot_path("../tests/expand");
    s.set_prepend_module_to_snapshot(false);
    s
}

fn snapshot(name: &str, attr: &str, item: &str) {
    let (out, errors) = expand_with_errors(tokens(attr), tokens(item));
    assert!(errors.is_empty(), "{name}: unexpected errors {errors:?}");
    let text = pretty(out);
    settings().bind(|| insta::assert_snapshot!(name, text));
}

#[test]
fn expand_elementwise_with_a_static() {
    snapshot(
        "elementwise_with_static",
        r#"aten = "aten::gelu", dtypes = [f32, bf16], defaults(approximate = "tanh"),
           require(approximate == "tanh"), cache_key = [approximate], output = same_as(self_),
           canonical = ["f32[8,128]"]"#,
        "/// GELU, tanh approximation.
         pub fn gelu_tanh(self_: Tensor, approximate: &str) -> Tensor { gelu(self_) }",
    );
}

#[test]
fn expand_multi_output_fallible_with_guards() {
    snapshot(
        "multi_output_with_guards",
        r#"aten = ["aten::native_layer_norm", "aten::native_layer_norm.out"],
           schema(input, normalized_shape, weight, bias, eps, seed),
           dtypes = [f32], same_dtype, shapes(input = [.., D], weight = [D], bias = f32[D]),
           require(D % 128 == 0), platforms = [cpu, tpu], priority = -2,
           defaults(eps = 1e-5), cache_key = [eps],
           ignore_in_cache_key(seed = "the seed only feeds a host-side RNG"),
           output = [input, reduced(input, -1), like(input, [D, 1])], backward = ln_backward"#,
        "fn layer_norm<'b>(input: Tensor<'b>, weight: Tensor<'b>, bias: Tensor<'b>, eps: f64,
             seed: i64) -> Result<(Tensor<'b>, Tensor<'b>, Tensor<'b>), BuildError> { body() }",
    );
}

#[test]
fn expand_imported() {
    snapshot(
        "imported",
        r#"op = "mylib::add", shapes(x = f32[8, N], y = f32[8, N]),
           import(cpu = "tests/fixtures/add.mlir")"#,
        "pub(crate) fn add(x: Tensor, y: Tensor) -> Tensor;",
    );
}

#[test]
fn expand_with_crate_override_and_output_fn() {
    snapshot(
        "crate_override",
        r#"crate = "crate", op = "tpuk::double", output_fn = double_types"#,
        "fn double(x: Tensor) -> Tensor { x + x }",
    );
}

#[test]
fn errors_keep_the_function_for_ides() {
    let out =
        expand(tokens(r#"aten = "gelu", bogus = 1"#), tokens("fn f(x: Tensor) -> Tensor { x }"));
    let text = out.to_string();
    assert_eq!(text.matches("compile_error").count(), 2, "{text}");
    assert!(text.contains("fn f"), "{text}");
}

/// (attribute, item, a fragment every error list must contain)
const MALFORMED: &[(&str, &str, &str)] = &[
    ("", "fn f(x: Tensor) -> Tensor { x }", "say what the kernel replaces"),
    ("aten", "fn f(x: Tensor) -> Tensor { x }", "expected `aten = ...`"),
    ("aten =", "fn f(x: Tensor) -> Tensor { x }", "expected a value"),
    ("aten = 1", "fn f(x: Tensor) -> Tensor { x }", "expected an op name string"),
    ("aten = \"\"", "fn f(x: Tensor) -> Tensor { x }", "malformed op name"),
    ("aten = \"aten::\"", "fn f(x: Tensor) -> Tensor { x }", "malformed op name"),
    ("aten = \"aten::a.b.c\"", "fn f(x: Tensor) -> Tensor { x }", "malformed op name"),
    ("\"aten::gelu\"", "fn f(x: Tensor) -> Tensor { x }", ""),
    ("aten = \"aten::gelu\",,", "fn f(x: Tensor) -> Tensor { x }", ""),
    ("aten = \"aten::gelu\" op = \"a::b\"", "fn f(x: Tensor) -> Tensor { x }", ""),
    ("op = \"a::b\", shapes", "fn f(x: Tensor) -> Tensor { x }", "expected `shapes(...)`"),
    ("op = \"a::b\", shapes(x)", "fn f(x: Tensor) -> Tensor { x }", "expected `x = [dims]`"),
    ("op = \"a::b\", shapes(x = )", "fn f(x: Tensor) -> Tensor { x }", "expected `[dims]`"),
    ("op = \"a::b\", shapes(x = [1, -])", "fn f(x: Tensor) -> Tensor { x }", "bad dimension"),
    ("op = \"a::b\", shapes(x = [.., ..])", "fn f(x: Tensor) -> Tensor { x }", "at most one"),
    ("op = \"a::b\", shapes(x = q8[1])", "fn f(x: Tensor) -> Tensor { x }", "unsupported dtype"),
    ("op = \"a::b\", shapes(x = [99999999999999999999999])", "fn f(x: Tensor) -> Tensor { x }", ""),
    ("op = \"a::b\", require(x ==)", "fn f(x: Tensor) -> Tensor { x }", ""),
    ("op = \"a::b\", require(x +)", "fn f(x: Tensor) -> Tensor { x }", ""),
    ("op = \"a::b\", require(D % 0 == 0)", "fn f(x: Tensor) -> Tensor { x }", ""),
    (
        "op = \"a::b\", shapes(x = [D]), require(D % 0 == 0)",
        "fn f(x: Tensor) -> Tensor { x }",
        "bad shape expression",
    ),
    (
        "op = \"a::b\", shapes(x = [D]), require(D == -1)",
        "fn f(x: Tensor) -> Tensor { x }",
        "non-negative",
    ),
    ("op = \"a::b\", priority = 99999999999", "fn f(x: Tensor) -> Tensor { x }", "priority"),
    ("op = \"a::b\", priority = 1.5", "fn f(x: Tensor) -> Tensor { x }", "priority"),
    ("op = \"a::b\", dtypes = []", "fn f(x: Tensor) -> Tensor { x }", "no dtype"),
    ("op = \"a::b\", dtypes = [[f32]]", "fn f(x: Tensor) -> Tensor { x }", "unsupported dtype"),
    ("op = \"a::b\", platforms = [gpu]", "fn f(x: Tensor) -> Tensor { x }", "unknown platform"),
    ("op = \"a::b\", defaults(1 = 2)", "fn f(x: Tensor) -> Tensor { x }", ""),
    ("op = \"a::b\", defaults(e = )", "fn f(x: Tensor, e: f64) -> Tensor { x }", ""),
    ("op = \"a::b\", cache_key = [1]", "fn f(x: Tensor) -> Tensor { x }", "static parameter name"),
    ("op = \"a::b\", ignore_in_cache_key(e)", "fn f(x: Tensor, e: f64) -> Tensor { x }", ""),
    (
        "op = \"a::b\", ignore_in_cache_key(e = 1)",
        "fn f(x: Tensor, e: f64) -> Tensor { x }",
        "string literal",
    ),
    ("op = \"a::b\", schema(1)", "fn f(x: Tensor) -> Tensor { x }", "schema"),
    ("op = \"a::b\", output = ", "fn f(x: Tensor) -> Tensor { x }", ""),
    ("op = \"a::b\", output = same_as()", "fn f(x: Tensor) -> Tensor { x }", "bad output rule"),
    ("op = \"a::b\", output = like(x, 3)", "fn f(x: Tensor) -> Tensor { x }", "list of dimensions"),
    (
        "op = \"a::b\", output = tensor(q1, [1])",
        "fn f(x: Tensor) -> Tensor { x }",
        "unsupported dtype",
    ),
    ("op = \"a::b\", output_fn = 3", "fn f(x: Tensor) -> Tensor { x }", "path of a function"),
    ("op = \"a::b\", backward = 3", "fn f(x: Tensor) -> Tensor { x }", "backward kernel"),
    ("op = \"a::b\", mutates = [y]", "fn f(x: Tensor) -> Tensor { x }", "not a tensor input"),
    ("op = \"a::b\", mutates = [x, x]", "fn f(x: Tensor) -> Tensor { x }", "listed twice"),
    ("op = \"a::b\", mutates = [3]", "fn f(x: Tensor) -> Tensor { x }", "updates in place"),
    (
        "op = \"a::b\", mutates = [x], backward = g",
        "fn f(x: Tensor) -> Tensor { x }",
        "has no backward",
    ),
    (
        "op = \"a::b\", mutates = [x, y], output = [same_as(x)]",
        "fn f(x: Tensor, y: Tensor) -> Tensor { x }",
        "has 1 outputs",
    ),
    ("op = \"a::b\", canonical = [1]", "fn f(x: Tensor) -> Tensor { x }", "signature string"),
    ("op = \"a::b\", canonical = [\"f32[\"]", "fn f(x: Tensor) -> Tensor { x }", "bad canonical"),
    ("op = \"a::b\", canonical = [\"; =\"]", "fn f(x: Tensor) -> Tensor { x }", "bad canonical"),
    ("op = \"a::b\", import", "fn f(x: Tensor) -> Tensor;", ""),
    ("op = \"a::b\", import()", "fn f(x: Tensor) -> Tensor;", "needs a module file"),
    ("op = \"a::b\", import(gpu = \"x\")", "fn f(x: Tensor) -> Tensor;", "unknown `import` key"),
    (
        "op = \"a::b\", import(cpu = \"tests/fixtures/broken.mlir\")",
        "fn f(x: Tensor) -> Tensor;",
        "not a StableHLO module",
    ),
    (
        "op = \"a::b\", import(cpu = \"tests/fixtures\")",
        "fn f(x: Tensor) -> Tensor;",
        "cannot read",
    ),
    (
        "op = \"a::b\", shapes(x = f32[N]), import(cpu = \"tests/fixtures/dynamic.mlir\")",
        "fn f(x: Tensor) -> Tensor;",
        "",
    ),
    (
        "op = \"a::b\", crate = \"1\"",
        "fn f(x: Tensor) -> Tensor { x }",
        "path to the tpu_kernels crate",
    ),
    ("op = \"a::b\"", "struct S;", "applies to a function"),
    ("op = \"a::b\"", "", "applies to a function"),
    ("op = \"a::b\"", "fn", "applies to a function"),
    ("op = \"a::b\"", "fn f(x:)", "applies to a function"),
    ("op = \"a::b\"", "fn f() {}", "at least one `Tensor`"),
    ("op = \"a::b\"", "fn f(x: Tensor) {}", "returns its outputs"),
    ("op = \"a::b\"", "fn f(x: Tensor) -> () { x }", "unsupported return type"),
    ("op = \"a::b\"", "fn f(x: Tensor) -> Result<i32, E> { x }", "unsupported return type"),
    ("op = \"a::b\"", "fn f(x: Tensor) -> Result { x }", "unsupported return type"),
    ("op = \"a::b\"", "fn f((a, b): (Tensor, Tensor)) -> Tensor { a }", "plain name"),
    ("op = \"a::b\"", "fn f(x: Tensor<f32>) -> Tensor { x }", "unsupported parameter type"),
    ("op = \"a::b\"", "fn f(x: &mut str) -> Tensor { x }", "unsupported parameter type"),
    ("op = \"a::b\"", "fn f(self, x: Tensor) -> Tensor { x }", "cannot take `self`"),
    ("op = \"a::b\"", "extern \"C\" fn f(x: Tensor) -> Tensor { x }", "ABI"),
    ("op = \"a::b\"", "const fn f(x: Tensor) -> Tensor { x }", "const fn"),
    (
        "op = \"a::b\"",
        "fn f<T, const N: usize>(x: Tensor) -> Tensor where T: Copy { x }",
        "generic",
    ),
];

#[test]
fn malformed_input_gives_errors_and_never_panics() {
    let mut failures = Vec::new();
    for (attr, item, expected) in MALFORMED {
        let result = std::panic::catch_unwind(|| expand_with_errors(tokens(attr), tokens(item)));
        let Ok((_, errors)) = result else {
            failures.push(format!("panicked on `{attr}` / `{item}`"));
            continue;
        };
        if !errors.iter().any(|e| e.contains(expected)) {
            failures
                .push(format!("`{attr}` / `{item}`: no error contains {expected:?}: {errors:?}"));
        }
        // The public entry point emits the errors.
        let out = expand(tokens(attr), tokens(item));
        if !out.to_string().contains("compile_error") {
            failures.push(format!("`{attr}` / `{item}`: no compile_error! in the output"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Every prefix of a valid attribute, cut at every token boundary that still tokenizes,
/// and every item truncated the same way: no panics.
#[test]
fn truncated_input_never_panics() {
    let attr = r#"aten = ["aten::gelu", "aten::gelu.out"], dtypes = [f32, bf16], same_dtype,
        shapes(x = f32[.., D], w = [D, 1, _]), require(D % 128 == 0, mode == "tanh"),
        platforms = [cpu], priority = -1, defaults(mode = "tanh"), cache_key = [mode],
        ignore_in_cache_key(mode = "r"), schema(self, mode), output = [same_as(x), like(x, [D])],
        output_fn = f, backward = g, canonical = ["f32[1]"], import(cpu = "x"), crate = "crate""#;
    let item = "pub fn k<'b>(x: Tensor<'b>, w: Tensor<'b>, mode: &str) -> Result<(Tensor<'b>, Tensor<'b>), E> { x }";
    let cuts = |s: &str| -> Vec<String> {
        (0..=s.len()).filter(|i| s.is_char_boundary(*i)).map(|i| s[..i].to_owned()).collect()
    };
    let mut runs = 0;
    for a in cuts(attr) {
        let Ok(a) = a.parse::<TokenStream>() else { continue };
        let r = std::panic::catch_unwind(|| expand(a.clone(), tokens(item)));
        assert!(r.is_ok(), "panicked on attribute `{a}`");
        runs += 1;
    }
    for i in cuts(item) {
        let Ok(i) = i.parse::<TokenStream>() else { continue };
        let r = std::panic::catch_unwind(|| expand(tokens("op = \"a::b\""), i.clone()));
        assert!(r.is_ok(), "panicked on item `{i}`");
        runs += 1;
    }
    assert!(runs > 100, "only {runs} inputs tokenized");
}
