//! The condition language of routes (`when = "..."` on a replication target) and the filter
//! step: SQL's expression grammar, as Azure Service Bus SQL filters and Stream Analytics
//! `WHERE` clauses write it.
//!
//! ```text
//! sys.enqueued_time > '2026-01-01T00:00:00Z' AND kind IN ('alarm', 'fault')
//!     AND body.reading.temperature BETWEEN 30 AND 80.5 AND NOT EXISTS(body.test)
//! ```
//!
//! - **Names**: `sys.<name>` (system properties: `sys.sequence_number`, `sys.offset`,
//!   `sys.enqueued_time`, `sys.partition_id`, `sys.partition_key`, `sys.content_type`,
//!   `sys.message_id`, `sys.correlation_id`), `user.<name>` (application properties; a bare
//!   name such as `kind` is `user.kind`, as in Service Bus; `user."my-prop"` quotes one),
//!   `body.<path>` (JSON body fields: `body.reading.temperature`, `body.items[0].id`,
//!   `body."device id"`, `body['a b']`) and `body` (the whole body).
//! - **Operators**: `= <> != < <= > >=`, `AND OR NOT`, `IS [NOT] NULL`,
//!   `IS [NOT] TRUE|FALSE`, `[NOT] IN (...)`, `[NOT] LIKE 'pat%_' [ESCAPE '!']`,
//!   `[NOT] BETWEEN a AND b`, `+ - * / %`, unary minus, parentheses.
//! - **Literals**: integers, decimals (`1.5`, `2e3`), `'strings'` (`''` is a quote), `TRUE`,
//!   `FALSE`, `NULL`, `TIMESTAMP '2026-01-01T00:00:00Z'`.
//! - **Functions**: `EXISTS(field)` (present, even if null), `LOWER(text)`, `UPPER(text)`,
//!   `LENGTH(text or JSON array)`, `ABS(number)`, `NOW()` (the editor's clock, for
//!   `sys.enqueued_time > NOW() - 60000`).
//!
//! # Semantics
//!
//! SQL's three-valued logic: a missing field (a body that is not JSON has no body fields),
//! NULL, a comparison of values of different types (a number with a string, say), and
//! division by zero are all *unknown*; `NOT unknown` is unknown, `unknown AND false` is false,
//! `unknown OR true` is true, and a condition that is unknown at the top does not match.
//! Numbers compare by value across every integer and float type of properties and JSON;
//! strings compare as strings (by code point); a time (`sys.enqueued_time`, a timestamp
//! property, `NOW()`) compares with a number of milliseconds since the Unix epoch or with an
//! RFC 3339 string. `/` divides exactly (`7 / 2` is `3.5`); a time plus or minus a number of
//! milliseconds is a time, and two times subtract to milliseconds.
//!
//! # Guarantees
//!
//! - **Checked when compiled.** An unknown `sys.` name, an unknown function or a wrong number
//!   of arguments, a construct the language does not have (subqueries, CASE, CAST, ...), a
//!   comparison that can never hold (`x = NULL`, a number with a string literal) and a time
//!   literal that is not RFC 3339 are errors that say where (line and column), what is wrong
//!   and what would be accepted.
//! - **Bounded.** A condition is at most [`TEXT_MAX_BYTES`] long and nests at most
//!   [`NESTING_MAX`] deep; deeper input is an error, never a stack overflow.
//! - **Never an error when evaluated**, and never a panic, whatever the event holds.
//! - **Cheap to evaluate.** The text is compiled once into a small tree; evaluating it reads
//!   the body's one shared JSON parse ([`Item::json`]) and allocates nothing except for
//!   `LOWER`/`UPPER`; LIKE patterns are compiled, and IN lists of strings are hash sets.

use std::any::TypeId;
use std::borrow::Cow;
use std::cmp::Ordering;
use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;

use serde_json::Value;
use sqlparser::ast::{
    self, AccessExpr, BinaryOperator, DataType, Function, FunctionArg, FunctionArgExpr,
    FunctionArguments, Ident, InTarget, ObjectName, ObjectNamePart, Spanned, Subscript,
    UnaryOperator,
};
use sqlparser::dialect::{Dialect, GenericDialect, Precedence};
use sqlparser::keywords::Keyword;
use sqlparser::parser::{Parser, ParserError};
use sqlparser::tokenizer::{Location, Token, TokenWithSpan, Tokenizer};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use tributary_event::PropertyValue;

use crate::field::{Field, FieldPath, FieldValue, Segment, SystemProperty};
use crate::item::Item;
use crate::step::Context;

/// The longest condition accepted: a condition is a line or a few of a task file, and the
/// bound keeps compiling it (and the stack the parser needs) small.
pub const TEXT_MAX_BYTES: usize = 4096;

/// The deepest nesting accepted (parentheses, function calls, operators that bind tighter than
/// the one before, NOT and unary minus each count a level): no real condition comes near it,
/// and it bounds the parser's recursion and the compiled tree's depth.
pub const NESTING_MAX: usize = 64;

/// sqlparser's own recursion limit: above what [`NESTING_MAX`] lets through (which is checked
/// first), so it only trips on constructs the nesting check does not model.
const PARSER_RECURSION_LIMIT: usize = 2 * NESTING_MAX;

/// The stack of the thread that parses a condition. sqlparser's frames are large in a debug
/// build (up to some 80 KiB a nesting level): the deepest input [`NESTING_MAX`] lets through
/// needed 5 to 6 MiB there (see the test
/// `every_shape_at_the_nesting_bound_compiles_without_overflowing_the_stack`), a release
/// build far less; this leaves room for that five times over. The memory is reserved, not
/// touched, and the thread lives only while one condition is compiled.
const PARSE_STACK_BYTES: usize = 32 << 20;

/// From this many strings on, an IN list is looked up in a hash set; below it, comparing a
/// few short strings is faster than hashing.
const IN_HASH_MIN: usize = 8;

/// A condition that could not be compiled.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ConditionError {
    /// What is wrong, where, and what would be accepted.
    pub message: String,
    /// The line of the text where the problem is (from 1), when known.
    pub line: Option<u64>,
    /// The column of the text where the problem is (from 1, in characters), when known.
    pub column: Option<u64>,
}

impl ConditionError {
    fn new(message: impl Into<String>) -> ConditionError {
        ConditionError {
            message: message.into(),
            line: None,
            column: None,
        }
    }

    /// An error at `location` (line 0 means no location is known).
    fn at(location: Location, message: impl fmt::Display) -> ConditionError {
        if location.line == 0 {
            return ConditionError::new(message.to_string());
        }
        let place = if location.line == 1 {
            format!("column {}", location.column)
        } else {
            format!("line {}, column {}", location.line, location.column)
        };
        ConditionError {
            message: format!("at {place}: {message}"),
            line: Some(location.line),
            column: Some(location.column),
        }
    }

    /// An error about `expr`, placed at its start.
    fn of(expr: &ast::Expr, message: impl fmt::Display) -> ConditionError {
        ConditionError::at(expr.span().start, message)
    }

    fn too_deep(location: Location) -> ConditionError {
        ConditionError::at(
            location,
            format!(
                "the condition nests deeper than {NESTING_MAX} levels (parentheses, function \
                 calls, NOT, unary minus and long chains of arithmetic count); simplify it"
            ),
        )
    }
}

/// A compiled condition.
#[derive(Clone)]
pub struct Condition {
    text: Arc<str>,
    root: Arc<Node>,
}

impl fmt::Debug for Condition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Condition")
            .field("text", &self.text)
            .finish_non_exhaustive()
    }
}

impl fmt::Display for Condition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl Condition {
    /// Compiles `text`.
    pub fn parse(text: &str) -> Result<Condition, ConditionError> {
        if text.len() > TEXT_MAX_BYTES {
            return Err(ConditionError::new(format!(
                "the condition is {} bytes long; at most {TEXT_MAX_BYTES} are accepted \
                 (an IN list of many values belongs in an enrich lookup table)",
                text.len()
            )));
        }
        if text.trim().is_empty() {
            return Err(ConditionError::new(
                "the condition is empty; write one such as `body.temperature > 30`",
            ));
        }
        let root = compile_on_own_stack(text)?;
        Ok(Condition {
            text: Arc::from(text),
            root: Arc::new(root),
        })
    }

    /// The condition as written.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Whether `item`, read from `context.partition`, satisfies the condition (unknown does
    /// not).
    pub fn matches(&self, context: &Context<'_>, item: &Item) -> bool {
        truth(&self.root.eval(context, item)) == Some(true)
    }
}

// ---------------------------------------------------------------------------------------------
// Parsing

/// GenericDialect's grammar (its identifiers, and its type id, so sqlparser's dialect checks
/// treat it as GenericDialect), plus `EXISTS(<expression>)` as a function, as Service Bus
/// writes it: sqlparser reads EXISTS only before a subquery. The `supports_*` extensions
/// GenericDialect turns on (map and struct literals, bit shifts, ...) are left off: the
/// language has none of them.
#[derive(Debug)]
struct ConditionDialect;

impl Dialect for ConditionDialect {
    fn dialect(&self) -> TypeId {
        TypeId::of::<GenericDialect>()
    }

    fn is_identifier_start(&self, ch: char) -> bool {
        GenericDialect.is_identifier_start(ch)
    }

    fn is_identifier_part(&self, ch: char) -> bool {
        GenericDialect.is_identifier_part(ch)
    }

    fn is_delimited_identifier_start(&self, ch: char) -> bool {
        GenericDialect.is_delimited_identifier_start(ch)
    }

    fn parse_prefix(&self, parser: &mut Parser<'_>) -> Option<Result<ast::Expr, ParserError>> {
        let is_keyword = |n: usize, keywords: &[Keyword]| {
            matches!(&parser.peek_nth_token_ref(n).token,
                Token::Word(w) if w.quote_style.is_none() && keywords.contains(&w.keyword))
        };
        // EXISTS ( not followed by a subquery; NOT before it, since sqlparser's NOT reads
        // EXISTS itself.
        let negated = usize::from(is_keyword(0, &[Keyword::NOT]));
        let exists_function = is_keyword(negated, &[Keyword::EXISTS])
            && parser.peek_nth_token_ref(negated + 1).token == Token::LParen
            && !is_keyword(
                negated + 2,
                &[Keyword::SELECT, Keyword::WITH, Keyword::VALUES],
            );
        if !exists_function {
            return None;
        }
        if negated == 1 {
            parser.next_token();
            let operand = parser.parse_subexpr(self.prec_value(Precedence::UnaryNot));
            return Some(operand.map(|operand| ast::Expr::UnaryOp {
                op: UnaryOperator::Not,
                expr: Box::new(operand),
            }));
        }
        let word = parser.next_token();
        let name = ObjectName::from(vec![Ident::with_span(word.span, "EXISTS")]);
        Some(parser.parse_function(name))
    }
}

/// Parses and compiles `text` on a thread whose stack is sized for the parser's recursion
/// (see [`PARSE_STACK_BYTES`]); the caller's stack may be small (a test's, a runtime
/// worker's).
fn compile_on_own_stack(text: &str) -> Result<Node, ConditionError> {
    std::thread::scope(|scope| {
        let worker = std::thread::Builder::new()
            .name("condition-compile".to_owned())
            .stack_size(PARSE_STACK_BYTES)
            .spawn_scoped(scope, || compile_text(text))
            .map_err(|e| {
                ConditionError::new(format!(
                    "cannot start a thread to compile the condition: {e}"
                ))
            })?;
        worker.join().unwrap_or_else(|_| {
            Err(ConditionError::new(
                "compiling the condition failed unexpectedly; please report it with the text",
            ))
        })
    })
}

fn compile_text(text: &str) -> Result<Node, ConditionError> {
    let dialect = ConditionDialect;
    let tokens = Tokenizer::new(&dialect, text)
        .tokenize_with_location()
        .map_err(|e| ConditionError::at(e.location, e.message))?;
    check_nesting(&tokens)?;
    let mut parser = Parser::new(&dialect)
        .with_recursion_limit(PARSER_RECURSION_LIMIT)
        .with_tokens_with_locations(tokens);
    let expr = parser.parse_expr().map_err(|e| match e {
        ParserError::RecursionLimitExceeded => ConditionError::too_deep(Location::new(0, 0)),
        ParserError::TokenizerError(m) | ParserError::ParserError(m) => {
            ConditionError::new(m.replace("found: EOF", "found: the end of the condition"))
        }
    })?;
    let next = parser.peek_token();
    if next.token != Token::EOF {
        return Err(ConditionError::at(
            next.span.start,
            format!(
                "unexpected `{}` after a complete condition; join conditions with AND or OR",
                next.token
            ),
        ));
    }
    let typed = compile(&expr, 0)?;
    require_truth(&typed, &expr)?;
    Ok(typed.node)
}

/// How a token moves the nesting a Pratt parser (sqlparser's) goes through.
enum Nesting {
    /// Whitespace, `.`, and NOT between an operand and LIKE, IN or BETWEEN.
    Neutral,
    /// `(`, `[`, `{`, CASE: a nested expression starts.
    Open,
    /// `)`, `]`, `}`, END.
    Close,
    /// `,`, WHEN, THEN, ELSE: the next expression starts afresh at the same level.
    Separator,
    /// An operator before its operand (NOT, unary minus), binding this tightly.
    Prefix(u8),
    /// An operator between operands, binding this tightly.
    Infix(u8),
    /// A name or a literal.
    Operand,
}

/// How tightly operators bind, in sqlparser's order (only the order matters).
const BIND_OR: u8 = 5;
const BIND_AND: u8 = 10;
const BIND_NOT: u8 = 15;
const BIND_IS: u8 = 17;
const BIND_COMPARE: u8 = 20;
const BIND_ADD: u8 = 30;
const BIND_MULTIPLY: u8 = 40;
const BIND_OTHER: u8 = 50;

fn nesting_of(token: &Token, after_operand: bool) -> Nesting {
    let binary = |bind| {
        if after_operand {
            Nesting::Infix(bind)
        } else {
            Nesting::Prefix(BIND_OTHER)
        }
    };
    match token {
        Token::Whitespace(_) | Token::EOF | Token::Period => Nesting::Neutral,
        Token::LParen | Token::LBracket | Token::LBrace => Nesting::Open,
        Token::RParen | Token::RBracket | Token::RBrace => Nesting::Close,
        Token::Comma => Nesting::Separator,
        Token::Word(w) if w.quote_style.is_none() => keyword_nesting(w.keyword, after_operand),
        Token::Plus | Token::Minus if !after_operand => Nesting::Prefix(BIND_MULTIPLY),
        Token::Plus | Token::Minus => Nesting::Infix(BIND_ADD),
        Token::Mul | Token::Div | Token::Mod | Token::DuckIntDiv => binary(BIND_MULTIPLY),
        Token::Eq
        | Token::DoubleEq
        | Token::Neq
        | Token::Lt
        | Token::Gt
        | Token::LtEq
        | Token::GtEq
        | Token::Spaceship => binary(BIND_COMPARE),
        token if is_operand(token) => Nesting::Operand,
        _ => binary(BIND_OTHER),
    }
}

fn keyword_nesting(keyword: Keyword, after_operand: bool) -> Nesting {
    match keyword {
        Keyword::OR | Keyword::XOR => Nesting::Infix(BIND_OR),
        Keyword::AND => Nesting::Infix(BIND_AND),
        Keyword::NOT if after_operand => Nesting::Neutral,
        Keyword::NOT => Nesting::Prefix(BIND_NOT),
        Keyword::IS => Nesting::Infix(BIND_IS),
        Keyword::IN
        | Keyword::LIKE
        | Keyword::ILIKE
        | Keyword::BETWEEN
        | Keyword::SIMILAR
        | Keyword::RLIKE
        | Keyword::REGEXP
        | Keyword::ESCAPE
            if after_operand =>
        {
            Nesting::Infix(BIND_COMPARE)
        }
        Keyword::CASE => Nesting::Open,
        Keyword::END => Nesting::Close,
        Keyword::WHEN | Keyword::THEN | Keyword::ELSE => Nesting::Separator,
        Keyword::INTERVAL | Keyword::PRIOR | Keyword::CONNECT_BY_ROOT if !after_operand => {
            Nesting::Prefix(BIND_OTHER)
        }
        _ => Nesting::Operand,
    }
}

fn is_operand(token: &Token) -> bool {
    matches!(
        token,
        Token::Word(_)
            | Token::Number(..)
            | Token::Char(_)
            | Token::Placeholder(_)
            | Token::SingleQuotedString(_)
            | Token::DoubleQuotedString(_)
            | Token::TripleSingleQuotedString(_)
            | Token::TripleDoubleQuotedString(_)
            | Token::DollarQuotedString(_)
            | Token::SingleQuotedByteStringLiteral(_)
            | Token::DoubleQuotedByteStringLiteral(_)
            | Token::TripleSingleQuotedByteStringLiteral(_)
            | Token::TripleDoubleQuotedByteStringLiteral(_)
            | Token::SingleQuotedRawStringLiteral(_)
            | Token::DoubleQuotedRawStringLiteral(_)
            | Token::TripleSingleQuotedRawStringLiteral(_)
            | Token::TripleDoubleQuotedRawStringLiteral(_)
            | Token::NationalStringLiteral(_)
            | Token::QuoteDelimitedStringLiteral(_)
            | Token::NationalQuoteDelimitedStringLiteral(_)
            | Token::EscapedStringLiteral(_)
            | Token::UnicodeStringLiteral(_)
            | Token::HexStringLiteral(_)
    )
}

/// Refuses token streams that would make the parser nest deeper than [`NESTING_MAX`].
///
/// This replays a Pratt parser's nesting on the tokens: a group opens a level; within one,
/// each operator whose right side is still open holds a level until an operator that binds
/// no tighter closes it, and each prefix operator holds one. sqlparser's own recursion counter
/// misses some of these (a chain of NOTs) and its frames are large in a debug build, so the
/// bound is checked before it runs; the tokenizer itself does not recurse.
fn check_nesting(tokens: &[TokenWithSpan]) -> Result<(), ConditionError> {
    let mut open: Vec<u8> = Vec::new();
    let mut groups: Vec<usize> = Vec::new();
    let mut after_operand = false;
    for token in tokens {
        let floor = groups.last().copied().unwrap_or(0);
        match nesting_of(&token.token, after_operand) {
            Nesting::Neutral => {}
            Nesting::Open => {
                groups.push(open.len());
                after_operand = false;
            }
            Nesting::Close => {
                open.truncate(groups.pop().unwrap_or(0));
                after_operand = true;
            }
            Nesting::Separator => {
                open.truncate(floor);
                after_operand = false;
            }
            Nesting::Prefix(bind) => {
                open.push(bind);
                after_operand = false;
            }
            Nesting::Infix(bind) => {
                while open.len() > floor && open.last().is_some_and(|&held| held >= bind) {
                    open.pop();
                }
                open.push(bind);
                after_operand = false;
            }
            Nesting::Operand => after_operand = true,
        }
        if groups.len() + open.len() > NESTING_MAX {
            return Err(ConditionError::too_deep(token.span.start));
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Compiling

/// What a compiled expression is known to give before any event is seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Bool,
    Number,
    Str,
    Time,
    Null,
    /// A property or body field: any of them, decided per event.
    Any,
}

impl Kind {
    fn describe(self) -> &'static str {
        match self {
            Kind::Bool => "a true/false value",
            Kind::Number => "a number",
            Kind::Str => "a string",
            Kind::Time => "a time",
            Kind::Null => "NULL",
            Kind::Any => "a field",
        }
    }
}

struct Typed {
    node: Node,
    kind: Kind,
}

impl Typed {
    fn new(node: Node, kind: Kind) -> Typed {
        Typed { node, kind }
    }
}

fn require_truth(typed: &Typed, expr: &ast::Expr) -> Result<(), ConditionError> {
    match typed.kind {
        Kind::Bool | Kind::Any => Ok(()),
        kind => Err(ConditionError::of(
            expr,
            format!(
                "`{expr}` is {}, not true or false; compare it (`{expr} = ...`) or test it \
                 (`{expr} IS NULL`)",
                kind.describe()
            ),
        )),
    }
}

fn compile(expr: &ast::Expr, depth: usize) -> Result<Typed, ConditionError> {
    if depth > NESTING_MAX {
        return Err(ConditionError::too_deep(expr.span().start));
    }
    if let Some(parts) = name_parts(expr)? {
        return field_of(&parts, expr);
    }
    let inner = depth + 1;
    match expr {
        ast::Expr::Value(value) => literal(&value.value, expr),
        ast::Expr::TypedString(typed) => typed_string(typed, expr),
        ast::Expr::Nested(nested) => compile(nested, inner),
        ast::Expr::UnaryOp { op, expr: operand } => unary(*op, operand, expr, inner),
        ast::Expr::BinaryOp {
            op: op @ (BinaryOperator::And | BinaryOperator::Or),
            ..
        } => logic(expr, op, inner),
        ast::Expr::BinaryOp { left, op, right } => binary(left, op, right, expr, inner),
        ast::Expr::IsNull(operand) => is_null(operand, false, inner),
        ast::Expr::IsNotNull(operand) => is_null(operand, true, inner),
        ast::Expr::IsTrue(operand) => is_bool(operand, true, false, inner),
        ast::Expr::IsNotTrue(operand) => is_bool(operand, true, true, inner),
        ast::Expr::IsFalse(operand) => is_bool(operand, false, false, inner),
        ast::Expr::IsNotFalse(operand) => is_bool(operand, false, true, inner),
        ast::Expr::In {
            expr: operand,
            target,
            negated,
            ..
        } => in_list(operand, target, *negated, expr, inner),
        ast::Expr::Between {
            expr: operand,
            negated,
            low,
            high,
        } => between([operand, low, high], *negated, expr, inner),
        ast::Expr::Like {
            negated,
            any: false,
            expr: operand,
            pattern,
            escape_char,
        } => like(operand, pattern, escape_char.as_deref(), *negated, inner),
        ast::Expr::Function(function) => call(function, expr, inner),
        other => Err(unsupported(other)),
    }
}

fn unsupported(expr: &ast::Expr) -> ConditionError {
    let what = match expr {
        ast::Expr::Subquery(_) | ast::Expr::Exists { .. } => "subqueries are",
        ast::Expr::Case { .. } => "CASE is",
        ast::Expr::Cast { .. } | ast::Expr::Convert { .. } => "CAST is",
        ast::Expr::ILike { .. } => "ILIKE is (write LOWER(x) LIKE 'pattern')",
        ast::Expr::Like { .. } => "LIKE ANY is",
        _ => "this construct is",
    };
    ConditionError::of(
        expr,
        format!(
            "`{expr}`: {what} not part of the condition language, which has comparisons, \
             AND/OR/NOT, IS NULL, IN, LIKE, BETWEEN, arithmetic and the functions {FUNCTIONS}"
        ),
    )
}

/// The functions, for messages.
const FUNCTIONS: &str =
    "EXISTS(field), LOWER(text), UPPER(text), LENGTH(text or array), ABS(number) and NOW()";

// Names ---------------------------------------------------------------------------------------

/// One part of a dotted or subscripted name, as written.
enum Part<'e> {
    Name(&'e Ident),
    Index(&'e ast::Expr),
}

/// The parts of `expr` if it is a name (`kind`, `sys.offset`, `body.items[0].id`).
fn name_parts(expr: &ast::Expr) -> Result<Option<Vec<Part<'_>>>, ConditionError> {
    Ok(Some(match expr {
        ast::Expr::Identifier(ident) => vec![Part::Name(ident)],
        ast::Expr::CompoundIdentifier(idents) => idents.iter().map(Part::Name).collect(),
        ast::Expr::Function(function) => match bare_user(function) {
            Some(ident) => vec![Part::Name(ident)],
            None => return Ok(None),
        },
        ast::Expr::CompoundFieldAccess { root, access_chain } => {
            let Some(mut parts) = name_parts(root)? else {
                return Ok(None);
            };
            for access in access_chain {
                match access {
                    AccessExpr::Dot(ast::Expr::Identifier(ident)) => parts.push(Part::Name(ident)),
                    AccessExpr::Dot(ast::Expr::CompoundIdentifier(idents)) => {
                        parts.extend(idents.iter().map(Part::Name));
                    }
                    AccessExpr::Subscript(Subscript::Index { index }) => {
                        parts.push(Part::Index(index));
                    }
                    _ => {
                        return Err(ConditionError::of(
                            expr,
                            format!(
                                "`{expr}` is not a field name: a path is keys and array \
                                 indexes, such as body.items[0].id"
                            ),
                        ));
                    }
                }
            }
            parts
        }
        _ => return Ok(None),
    }))
}

/// `user` written bare: sqlparser reads it as SQL's USER function.
fn bare_user(function: &Function) -> Option<&Ident> {
    match (&function.args, function.name.0.as_slice()) {
        (FunctionArguments::None, [ObjectNamePart::Identifier(ident)])
            if ident.quote_style.is_none() && ident.value.eq_ignore_ascii_case("user") =>
        {
            Some(ident)
        }
        _ => None,
    }
}

fn system_names() -> String {
    let names: Vec<String> = SystemProperty::ALL
        .iter()
        .map(|(name, _)| format!("sys.{name}"))
        .collect();
    names.join(", ")
}

fn field_of(parts: &[Part<'_>], expr: &ast::Expr) -> Result<Typed, ConditionError> {
    let error = |message: String| Err(ConditionError::of(expr, message));
    let Some((Part::Name(scope), rest)) = parts.split_first() else {
        return error(format!("`{expr}` is not a field name"));
    };
    let scope_word = match scope.quote_style {
        None => scope.value.to_ascii_lowercase(),
        Some(_) => String::new(),
    };
    match (scope_word.as_str(), rest) {
        ("sys", [Part::Name(name)]) => match SystemProperty::named(&name.value) {
            Some(property) => Ok(Typed::new(
                Node::Field(Field::System(property)),
                system_kind(property),
            )),
            None => error(format!(
                "sys.{} is not a system property; they are {}",
                name.value,
                system_names()
            )),
        },
        ("sys", _) => error(format!(
            "`{expr}`: write sys.<name>, one of {}",
            system_names()
        )),
        ("user", [Part::Name(name)]) => Ok(Typed::new(
            Node::Field(Field::User(name.value.clone())),
            Kind::Any,
        )),
        ("user", _) => error(format!(
            "`{expr}`: write user.<name> for an application property (quote a name with \
             other characters: user.\"my-prop\")"
        )),
        ("body", rest) => body_field(rest, expr),
        (_, []) => Ok(Typed::new(
            Node::Field(Field::User(scope.value.clone())),
            Kind::Any,
        )),
        _ => error(format!(
            "`{expr}` is not a field: names start with sys., user. or body. (a bare name such \
             as kind is the application property user.kind)"
        )),
    }
}

fn system_kind(property: SystemProperty) -> Kind {
    match property {
        SystemProperty::SequenceNumber | SystemProperty::Offset => Kind::Number,
        SystemProperty::EnqueuedTime => Kind::Time,
        SystemProperty::PartitionId
        | SystemProperty::PartitionKey
        | SystemProperty::ContentType
        | SystemProperty::MessageId
        | SystemProperty::CorrelationId => Kind::Str,
    }
}

fn body_field(parts: &[Part<'_>], expr: &ast::Expr) -> Result<Typed, ConditionError> {
    let mut segments = Vec::with_capacity(parts.len());
    for part in parts {
        segments.push(match part {
            Part::Name(ident) => Segment::Key(ident.value.clone()),
            Part::Index(index) => index_segment(index)?,
        });
    }
    let path = FieldPath::new(segments).map_err(|m| ConditionError::of(expr, m))?;
    Ok(Typed::new(Node::Field(Field::Body(path)), Kind::Any))
}

fn index_segment(index: &ast::Expr) -> Result<Segment, ConditionError> {
    if let ast::Expr::Value(value) = index {
        match &value.value {
            ast::Value::Number(digits, _) => {
                if let Ok(at) = digits.parse::<usize>() {
                    return Ok(Segment::Index(at));
                }
            }
            ast::Value::SingleQuotedString(key) => return Ok(Segment::Key(key.clone())),
            _ => {}
        }
    }
    Err(ConditionError::of(
        index,
        format!(
            "[{index}] is not an array index or a key: write a whole number such as [0] or a \
             quoted key such as ['a b']"
        ),
    ))
}

// Literals ------------------------------------------------------------------------------------

fn literal(value: &ast::Value, expr: &ast::Expr) -> Result<Typed, ConditionError> {
    Ok(match value {
        ast::Value::Number(text, _) => {
            Typed::new(Node::Const(Const::Num(number(text, expr)?)), Kind::Number)
        }
        ast::Value::SingleQuotedString(text) => Typed::new(
            Node::Const(Const::Str(text.as_str().into(), rfc3339_ms(text))),
            Kind::Str,
        ),
        ast::Value::Boolean(b) => Typed::new(Node::Const(Const::Bool(*b)), Kind::Bool),
        ast::Value::Null => Typed::new(Node::Const(Const::Null), Kind::Null),
        ast::Value::Placeholder(name) => {
            return Err(ConditionError::of(
                expr,
                format!("parameters such as {name} are not supported; write the value itself"),
            ));
        }
        other => {
            return Err(ConditionError::of(
                expr,
                format!(
                    "{other} is not a literal of the condition language: write numbers, \
                     'strings' (a quote inside is ''), TRUE, FALSE or NULL"
                ),
            ));
        }
    })
}

fn number(text: &str, expr: &ast::Expr) -> Result<Num, ConditionError> {
    if text.bytes().all(|b| b.is_ascii_digit())
        && let Ok(n) = text.parse::<i128>()
    {
        return Ok(Num::Int(n));
    }
    match text.parse::<f64>() {
        Ok(f) if f.is_finite() => Ok(Num::Float(f)),
        _ => Err(ConditionError::of(
            expr,
            format!("{text} is not a number a condition can hold (it is out of range)"),
        )),
    }
}

fn typed_string(typed: &ast::TypedString, expr: &ast::Expr) -> Result<Typed, ConditionError> {
    let text = match (&typed.data_type, &typed.value.value) {
        (DataType::Timestamp(..), ast::Value::SingleQuotedString(text)) => text,
        _ => {
            return Err(ConditionError::of(
                expr,
                format!(
                    "`{expr}`: of typed literals only TIMESTAMP '<RFC 3339 time>' is supported"
                ),
            ));
        }
    };
    match rfc3339_ms(text) {
        Some(ms) => Ok(Typed::new(Node::Const(Const::Time(ms)), Kind::Time)),
        None => Err(not_a_time(text, expr)),
    }
}

fn not_a_time(text: &str, expr: &ast::Expr) -> ConditionError {
    ConditionError::of(
        expr,
        format!("'{text}' is not an RFC 3339 time such as '2026-01-01T00:00:00Z'"),
    )
}

/// `text` as ms since the Unix epoch, if it is an RFC 3339 time.
fn rfc3339_ms(text: &str) -> Option<i64> {
    let time = OffsetDateTime::parse(text, &Rfc3339).ok()?;
    i64::try_from(time.unix_timestamp_nanos().div_euclid(1_000_000)).ok()
}

// Operators -----------------------------------------------------------------------------------

fn unary(
    op: UnaryOperator,
    operand: &ast::Expr,
    expr: &ast::Expr,
    depth: usize,
) -> Result<Typed, ConditionError> {
    let typed = compile(operand, depth)?;
    match op {
        UnaryOperator::Not => {
            require_truth(&typed, operand)?;
            Ok(Typed::new(Node::Not(Box::new(typed.node)), Kind::Bool))
        }
        UnaryOperator::Minus | UnaryOperator::Plus => {
            if !matches!(typed.kind, Kind::Number | Kind::Any) {
                return Err(ConditionError::of(
                    expr,
                    format!(
                        "`{expr}`: {op} takes a number; `{operand}` is {}",
                        typed.kind.describe()
                    ),
                ));
            }
            Ok(match (op, typed.node) {
                (UnaryOperator::Plus, node) => Typed::new(node, typed.kind),
                (_, Node::Const(Const::Num(n))) => {
                    let negated = negate(n).ok_or_else(|| {
                        ConditionError::of(expr, format!("`{expr}` is out of range"))
                    })?;
                    Typed::new(Node::Const(Const::Num(negated)), Kind::Number)
                }
                (_, node) => Typed::new(Node::Negate(Box::new(node)), typed.kind),
            })
        }
        _ => Err(unsupported(expr)),
    }
}

/// `a AND b AND c` (a chain sqlparser nests to the left) as one node of all its operands, so
/// a long chain neither nests deep nor counts against [`NESTING_MAX`].
fn logic(expr: &ast::Expr, op: &BinaryOperator, depth: usize) -> Result<Typed, ConditionError> {
    let mut operands = Vec::new();
    let mut at = expr;
    while let ast::Expr::BinaryOp {
        left,
        op: this,
        right,
    } = at
        && this == op
    {
        operands.push(right.as_ref());
        at = left;
    }
    operands.push(at);
    operands.reverse();
    let mut nodes = Vec::with_capacity(operands.len());
    for operand in operands {
        let typed = compile(operand, depth)?;
        require_truth(&typed, operand)?;
        nodes.push(typed.node);
    }
    let node = match op {
        BinaryOperator::And => Node::And(nodes.into_boxed_slice()),
        _ => Node::Or(nodes.into_boxed_slice()),
    };
    Ok(Typed::new(node, Kind::Bool))
}

fn binary(
    left: &ast::Expr,
    op: &BinaryOperator,
    right: &ast::Expr,
    expr: &ast::Expr,
    depth: usize,
) -> Result<Typed, ConditionError> {
    let compare = match op {
        BinaryOperator::Eq => Some(Compare::Eq),
        BinaryOperator::NotEq => Some(Compare::Ne),
        BinaryOperator::Lt => Some(Compare::Lt),
        BinaryOperator::LtEq => Some(Compare::Le),
        BinaryOperator::Gt => Some(Compare::Gt),
        BinaryOperator::GtEq => Some(Compare::Ge),
        _ => None,
    };
    let arith = match op {
        BinaryOperator::Plus => Some(Arith::Add),
        BinaryOperator::Minus => Some(Arith::Sub),
        BinaryOperator::Multiply => Some(Arith::Mul),
        BinaryOperator::Divide => Some(Arith::Div),
        BinaryOperator::Modulo => Some(Arith::Rem),
        _ => None,
    };
    if compare.is_none() && arith.is_none() {
        return Err(ConditionError::of(
            expr,
            format!(
                "`{expr}`: the operator {op} is not supported; the operators are = <> != < <= \
                 > >= AND OR NOT + - * / %"
            ),
        ));
    }
    let l = compile(left, depth)?;
    let r = compile(right, depth)?;
    match (compare, arith) {
        (Some(compare), _) => {
            comparable(&l, &r, expr)?;
            let operands = Box::new([l.node, r.node]);
            Ok(Typed::new(Node::Compare(operands, compare), Kind::Bool))
        }
        (None, Some(arith)) => arithmetic(l, arith, r, expr),
        (None, None) => Err(unsupported(expr)),
    }
}

/// Refuses comparisons that can never hold, with what to write instead.
fn comparable(l: &Typed, r: &Typed, expr: &ast::Expr) -> Result<(), ConditionError> {
    let fail = |message: String| Err(ConditionError::of(expr, message));
    if l.kind == Kind::Null || r.kind == Kind::Null {
        return fail(format!(
            "`{expr}` is never true: comparing with NULL is unknown; write `x IS NULL` or \
             `x IS NOT NULL`"
        ));
    }
    for (time, other) in [(l, r), (r, l)] {
        if time.kind == Kind::Time
            && let Node::Const(Const::Str(text, None)) = &other.node
        {
            return fail(format!(
                "'{text}' is not an RFC 3339 time such as '2026-01-01T00:00:00Z' (a time \
                 compares with one, or with a number of milliseconds since 1970)"
            ));
        }
    }
    match (l.kind, r.kind) {
        (Kind::Any, _) | (_, Kind::Any) => Ok(()),
        (a, b) if a == b => Ok(()),
        (Kind::Number | Kind::Str, Kind::Time) | (Kind::Time, Kind::Number | Kind::Str) => Ok(()),
        (a, b) => {
            let hint = [l, r]
                .into_iter()
                .find_map(|t| match &t.node {
                    Node::Const(Const::Str(text, _)) if text.parse::<f64>().is_ok() => {
                        Some(format!("; write {text} without quotes to compare numbers"))
                    }
                    _ => None,
                })
                .unwrap_or_default();
            fail(format!(
                "`{expr}` compares {} with {}, which is never true{hint}",
                a.describe(),
                b.describe()
            ))
        }
    }
}

fn arithmetic(l: Typed, op: Arith, r: Typed, expr: &ast::Expr) -> Result<Typed, ConditionError> {
    let additive = matches!(op, Arith::Add | Arith::Sub);
    let kind = match (l.kind, r.kind) {
        (Kind::Null | Kind::Str | Kind::Bool, _) | (_, Kind::Null | Kind::Str | Kind::Bool) => None,
        (Kind::Number, Kind::Number) => Some(Kind::Number),
        (Kind::Time, Kind::Number) if additive => Some(Kind::Time),
        (Kind::Time, Kind::Any) if op == Arith::Add => Some(Kind::Time),
        (Kind::Time, Kind::Any) if op == Arith::Sub => Some(Kind::Any),
        (Kind::Number | Kind::Any, Kind::Time) if op == Arith::Add => Some(Kind::Time),
        (Kind::Time | Kind::Any, Kind::Time) if op == Arith::Sub => Some(Kind::Number),
        (Kind::Time, _) | (_, Kind::Time) => None,
        _ => Some(Kind::Any),
    };
    let Some(kind) = kind else {
        return Err(ConditionError::of(
            expr,
            format!(
                "`{expr}`: arithmetic works on numbers, and on times with + and - milliseconds \
                 (two times subtract to milliseconds); here it has {} and {}",
                l.kind.describe(),
                r.kind.describe()
            ),
        ));
    };
    Ok(Typed::new(
        Node::Arith(Box::new([l.node, r.node]), op),
        kind,
    ))
}

fn is_null(operand: &ast::Expr, negated: bool, depth: usize) -> Result<Typed, ConditionError> {
    let typed = compile(operand, depth)?;
    Ok(Typed::new(
        Node::IsNull(Box::new(typed.node), negated),
        Kind::Bool,
    ))
}

fn is_bool(
    operand: &ast::Expr,
    value: bool,
    negated: bool,
    depth: usize,
) -> Result<Typed, ConditionError> {
    let typed = compile(operand, depth)?;
    require_truth(&typed, operand)?;
    Ok(Typed::new(
        Node::IsBool(Box::new(typed.node), value, negated),
        Kind::Bool,
    ))
}

fn in_list(
    operand: &ast::Expr,
    target: &InTarget,
    negated: bool,
    expr: &ast::Expr,
    depth: usize,
) -> Result<Typed, ConditionError> {
    let InTarget::List(items) = target else {
        return Err(ConditionError::of(
            expr,
            format!("`{expr}`: IN takes a list of values in parentheses, such as IN ('a', 'b')"),
        ));
    };
    let subject = compile(operand, depth)?;
    let mut constants = Vec::new();
    let mut others = Vec::new();
    for item in items {
        let typed = compile(item, depth)?;
        if typed.kind == Kind::Null {
            return Err(ConditionError::of(
                item,
                "NULL in an IN list is never equal to anything and makes NOT IN never true; \
                 leave it out and test `x IS NULL` instead",
            ));
        }
        comparable(&subject, &typed, expr)?;
        match typed.node {
            Node::Const(constant) => constants.push(constant),
            node => others.push(node),
        }
    }
    let strings = StrSet::of(&constants);
    let list = InList {
        subject: subject.node,
        constants: constants.into_boxed_slice(),
        strings,
        others: others.into_boxed_slice(),
    };
    let node = Node::In(Box::new(list));
    Ok(Typed::new(negate_if(node, negated), Kind::Bool))
}

fn negate_if(node: Node, negated: bool) -> Node {
    if negated {
        Node::Not(Box::new(node))
    } else {
        node
    }
}

fn between(
    [operand, low, high]: [&ast::Expr; 3],
    negated: bool,
    expr: &ast::Expr,
    depth: usize,
) -> Result<Typed, ConditionError> {
    let subject = compile(operand, depth)?;
    let low = compile(low, depth)?;
    let high = compile(high, depth)?;
    comparable(&subject, &low, expr)?;
    comparable(&subject, &high, expr)?;
    let node = Node::Between(Box::new([subject.node, low.node, high.node]));
    Ok(Typed::new(negate_if(node, negated), Kind::Bool))
}

fn like(
    operand: &ast::Expr,
    pattern: &ast::Expr,
    escape: Option<&ast::Expr>,
    negated: bool,
    depth: usize,
) -> Result<Typed, ConditionError> {
    let subject = compile(operand, depth)?;
    if !matches!(subject.kind, Kind::Str | Kind::Any) {
        return Err(ConditionError::of(
            operand,
            format!(
                "LIKE matches strings; `{operand}` is {}",
                subject.kind.describe()
            ),
        ));
    }
    let Some(text) = quoted(pattern) else {
        return Err(ConditionError::of(
            pattern,
            format!("LIKE takes a quoted pattern such as 'abc%', not `{pattern}`"),
        ));
    };
    let escape = match escape {
        None => None,
        Some(escape) => match quoted(escape).map(|e| {
            let mut chars = e.chars();
            (chars.next(), chars.next())
        }) {
            Some((Some(c), None)) => Some(c),
            _ => {
                return Err(ConditionError::of(
                    escape,
                    format!("ESCAPE takes one quoted character such as '!', not `{escape}`"),
                ));
            }
        },
    };
    let compiled = Like::compile(text, escape).map_err(|m| ConditionError::of(pattern, m))?;
    let node = Node::Like(Box::new(subject.node), Box::new(compiled));
    Ok(Typed::new(negate_if(node, negated), Kind::Bool))
}

fn quoted(expr: &ast::Expr) -> Option<&str> {
    match expr {
        ast::Expr::Value(value) => match &value.value {
            ast::Value::SingleQuotedString(text) => Some(text),
            _ => None,
        },
        _ => None,
    }
}

// Functions -----------------------------------------------------------------------------------

/// The arguments of a plain call `name(a, b)`; `None` for anything more (DISTINCT, FILTER,
/// OVER, named arguments, ...).
fn plain_arguments(function: &Function) -> Option<Vec<&ast::Expr>> {
    let FunctionArguments::List(list) = &function.args else {
        return None;
    };
    let plain = matches!(function.parameters, FunctionArguments::None)
        && list.duplicate_treatment.is_none()
        && list.clauses.is_empty()
        && function.filter.is_none()
        && function.over.is_none()
        && function.null_treatment.is_none()
        && function.within_group.is_empty();
    if !plain {
        return None;
    }
    list.args
        .iter()
        .map(|arg| match arg {
            FunctionArg::Unnamed(FunctionArgExpr::Expr(expr)) => Some(expr),
            _ => None,
        })
        .collect()
}

fn call(function: &Function, expr: &ast::Expr, depth: usize) -> Result<Typed, ConditionError> {
    let name = match function.name.0.as_slice() {
        [ObjectNamePart::Identifier(ident)] => ident.value.to_ascii_uppercase(),
        _ => String::new(),
    };
    let Some(args) = plain_arguments(function) else {
        return Err(ConditionError::of(
            expr,
            format!(
                "`{expr}` is not a call the condition language has; its functions are {FUNCTIONS}"
            ),
        ));
    };
    let arity = match name.as_str() {
        "NOW" => 0,
        "EXISTS" | "LOWER" | "UPPER" | "LENGTH" | "ABS" => 1,
        _ => {
            return Err(ConditionError::of(
                expr,
                format!(
                    "{} is not a function of the condition language; its functions are {FUNCTIONS}",
                    function.name
                ),
            ));
        }
    };
    if args.len() != arity {
        let s = if arity == 1 { "" } else { "s" };
        return Err(ConditionError::of(
            expr,
            format!(
                "`{expr}`: {name} takes {arity} argument{s}, not {}",
                args.len()
            ),
        ));
    }
    let Some(&arg) = args.first() else {
        return Ok(Typed::new(Node::Now, Kind::Time));
    };
    if name == "EXISTS" {
        return match compile(arg, depth)?.node {
            Node::Field(field) => Ok(Typed::new(Node::Exists(field), Kind::Bool)),
            _ => Err(ConditionError::of(
                arg,
                format!("EXISTS takes a field such as body.reading or user.kind, not `{arg}`"),
            )),
        };
    }
    let typed = compile(arg, depth)?;
    let (function, takes, gives) = match name.as_str() {
        "LOWER" => (Func::Lower, Kind::Str, Kind::Str),
        "UPPER" => (Func::Upper, Kind::Str, Kind::Str),
        "LENGTH" => (Func::Length, Kind::Str, Kind::Number),
        _ => (Func::Abs, Kind::Number, Kind::Number),
    };
    if typed.kind != takes && typed.kind != Kind::Any {
        return Err(ConditionError::of(
            arg,
            format!(
                "{name} takes {}; `{arg}` is {}",
                takes.describe(),
                typed.kind.describe()
            ),
        ));
    }
    Ok(Typed::new(
        Node::Call(function, Box::new(typed.node)),
        gives,
    ))
}

// ---------------------------------------------------------------------------------------------
// The compiled tree and its evaluation

/// A compiled expression.
#[derive(Debug)]
enum Node {
    Const(Const),
    Field(Field),
    Now,
    Negate(Box<Node>),
    Arith(Box<[Node; 2]>, Arith),
    Call(Func, Box<Node>),
    Compare(Box<[Node; 2]>, Compare),
    And(Box<[Node]>),
    Or(Box<[Node]>),
    Not(Box<Node>),
    /// `x IS NULL`, or `x IS NOT NULL` when set.
    IsNull(Box<Node>, bool),
    /// `x IS <value>`, or `x IS NOT <value>` when set.
    IsBool(Box<Node>, bool, bool),
    Exists(Field),
    In(Box<InList>),
    Like(Box<Node>, Box<Like>),
    /// Subject, low, high.
    Between(Box<[Node; 3]>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Compare {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl Compare {
    fn holds(self, ordering: Ordering) -> bool {
        match self {
            Compare::Eq => ordering.is_eq(),
            Compare::Ne => ordering.is_ne(),
            Compare::Lt => ordering.is_lt(),
            Compare::Le => ordering.is_le(),
            Compare::Gt => ordering.is_gt(),
            Compare::Ge => ordering.is_ge(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Arith {
    Add,
    Sub,
    Mul,
    Div,
    Rem,
}

#[derive(Debug, Clone, Copy)]
enum Func {
    Lower,
    Upper,
    Length,
    Abs,
}

/// A literal.
#[derive(Debug)]
enum Const {
    Null,
    Bool(bool),
    Num(Num),
    /// A string, with its time if it is an RFC 3339 time.
    Str(Box<str>, Option<i64>),
    /// ms since the Unix epoch.
    Time(i64),
}

impl Const {
    fn val(&self) -> Val<'_> {
        match self {
            Const::Null => Val::Null,
            Const::Bool(b) => Val::Bool(*b),
            Const::Num(n) => Val::Num(*n),
            Const::Str(text, None) => Val::Str(Cow::Borrowed(text)),
            Const::Str(text, Some(ms)) => Val::Stamp(text, *ms),
            Const::Time(ms) => Val::Time(*ms),
        }
    }
}

/// A number: every integer type fits `i128` exactly.
#[derive(Debug, Clone, Copy)]
enum Num {
    Int(i128),
    Float(f64),
}

/// A value met while evaluating, borrowed from the event or the condition where it can be.
#[derive(Debug)]
enum Val<'a> {
    /// NULL, a missing field, or unknown (a type mismatch, division by zero).
    Null,
    Bool(bool),
    Num(Num),
    Str(Cow<'a, str>),
    /// A string literal that is also an RFC 3339 time: a string to strings, a time to times.
    Stamp(&'a str, i64),
    /// ms since the Unix epoch.
    Time(i64),
    /// A JSON object or array.
    Json(&'a Value),
    /// Bytes or a UUID: present, but comparable with nothing.
    Opaque,
}

impl<'a> Val<'a> {
    fn of_field(value: FieldValue<'a>) -> Val<'a> {
        match value {
            FieldValue::Property(property) => Val::of_property(property),
            FieldValue::Json(json) => Val::of_json(json),
            FieldValue::Str(text) => Val::Str(Cow::Borrowed(text)),
            FieldValue::Int(n) => Val::Num(Num::Int(n.into())),
            FieldValue::Time(ms) => Val::Time(ms),
        }
    }

    fn of_property(property: &'a PropertyValue) -> Val<'a> {
        match property {
            PropertyValue::Null => Val::Null,
            PropertyValue::Bool(b) => Val::Bool(*b),
            PropertyValue::Int32(n) => Val::Num(Num::Int((*n).into())),
            PropertyValue::Int64(n) => Val::Num(Num::Int((*n).into())),
            PropertyValue::UInt32(n) => Val::Num(Num::Int((*n).into())),
            PropertyValue::UInt64(n) => Val::Num(Num::Int((*n).into())),
            PropertyValue::Float32(f) => Val::Num(Num::Float((*f).into())),
            PropertyValue::Float64(f) => Val::Num(Num::Float(*f)),
            PropertyValue::String(text) => Val::Str(Cow::Borrowed(text)),
            PropertyValue::Timestamp(ms) => Val::Time(*ms),
            PropertyValue::Bytes(_) | PropertyValue::Uuid(_) => Val::Opaque,
        }
    }

    fn of_json(json: &'a Value) -> Val<'a> {
        match json {
            Value::Null => Val::Null,
            Value::Bool(b) => Val::Bool(*b),
            Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
                (Some(i), _, _) => Val::Num(Num::Int(i.into())),
                (_, Some(u), _) => Val::Num(Num::Int(u.into())),
                (_, _, Some(f)) => Val::Num(Num::Float(f)),
                _ => Val::Null,
            },
            Value::String(text) => Val::Str(Cow::Borrowed(text)),
            Value::Array(_) | Value::Object(_) => Val::Json(json),
        }
    }

    fn as_str(&self) -> Option<&str> {
        match self {
            Val::Str(text) => Some(text),
            Val::Stamp(text, _) => Some(text),
            _ => None,
        }
    }
}

/// True, false, or unknown (`None`); only a boolean is true or false.
fn truth(value: &Val<'_>) -> Option<bool> {
    match value {
        Val::Bool(b) => Some(*b),
        _ => None,
    }
}

fn known(truth: Option<bool>) -> Val<'static> {
    truth.map_or(Val::Null, Val::Bool)
}

impl Node {
    fn eval<'a>(&'a self, cx: &Context<'a>, item: &'a Item) -> Val<'a> {
        match self {
            Node::Const(constant) => constant.val(),
            Node::Field(field) => field.get(cx, item).map_or(Val::Null, Val::of_field),
            Node::Now => Val::Time(cx.now_ms),
            Node::Negate(operand) => match operand.eval(cx, item) {
                Val::Num(n) => negate(n).map_or(Val::Null, Val::Num),
                _ => Val::Null,
            },
            Node::Arith(operands, op) => {
                let [l, r] = operands.as_ref();
                arith(*op, l.eval(cx, item), r.eval(cx, item))
            }
            Node::Call(function, arg) => call_function(*function, arg.eval(cx, item)),
            Node::Compare(operands, op) => {
                let [l, r] = operands.as_ref();
                let ordering = compare(&l.eval(cx, item), &r.eval(cx, item));
                known(ordering.map(|o| op.holds(o)))
            }
            Node::And(operands) => known(all_true(operands, cx, item)),
            Node::Or(operands) => known(any_true(operands, cx, item)),
            Node::Not(operand) => known(truth(&operand.eval(cx, item)).map(|b| !b)),
            Node::IsNull(operand, negated) => {
                Val::Bool(matches!(operand.eval(cx, item), Val::Null) != *negated)
            }
            Node::IsBool(operand, value, negated) => {
                Val::Bool((truth(&operand.eval(cx, item)) == Some(*value)) != *negated)
            }
            Node::Exists(field) => Val::Bool(field.get(cx, item).is_some()),
            Node::In(list) => known(list.eval(cx, item)),
            Node::Like(operand, pattern) => {
                let value = operand.eval(cx, item);
                known(value.as_str().map(|text| pattern.matches(text)))
            }
            Node::Between(operands) => {
                let [subject, low, high] = operands.as_ref();
                let subject = subject.eval(cx, item);
                let above = compare(&subject, &low.eval(cx, item)).map(Ordering::is_ge);
                let below = compare(&subject, &high.eval(cx, item)).map(Ordering::is_le);
                known(and3(above, below))
            }
        }
    }
}

fn and3(a: Option<bool>, b: Option<bool>) -> Option<bool> {
    match (a, b) {
        (Some(false), _) | (_, Some(false)) => Some(false),
        (Some(true), Some(true)) => Some(true),
        _ => None,
    }
}

/// SQL's AND over `operands`: false if one is false, else unknown if one is unknown.
fn all_true<'a>(operands: &'a [Node], cx: &Context<'a>, item: &'a Item) -> Option<bool> {
    let mut unknown = false;
    for operand in operands {
        match truth(&operand.eval(cx, item)) {
            Some(false) => return Some(false),
            Some(true) => {}
            None => unknown = true,
        }
    }
    (!unknown).then_some(true)
}

/// SQL's OR over `operands`: true if one is true, else unknown if one is unknown.
fn any_true<'a>(operands: &'a [Node], cx: &Context<'a>, item: &'a Item) -> Option<bool> {
    let mut unknown = false;
    for operand in operands {
        match truth(&operand.eval(cx, item)) {
            Some(true) => return Some(true),
            Some(false) => {}
            None => unknown = true,
        }
    }
    (!unknown).then_some(false)
}

/// How `a` compares with `b`; `None` (unknown) for NULL and values of different types.
fn compare(a: &Val<'_>, b: &Val<'_>) -> Option<Ordering> {
    match (a, b) {
        (Val::Num(x), Val::Num(y)) => num_cmp(*x, *y),
        (Val::Time(x), Val::Time(y)) => Some(x.cmp(y)),
        (Val::Time(t), Val::Num(n)) => num_cmp(Num::Int((*t).into()), *n),
        (Val::Num(n), Val::Time(t)) => num_cmp(*n, Num::Int((*t).into())),
        (Val::Time(t), Val::Stamp(_, ms)) => Some(t.cmp(ms)),
        (Val::Stamp(_, ms), Val::Time(t)) => Some(ms.cmp(t)),
        (Val::Time(t), Val::Str(text)) => rfc3339_ms(text).map(|ms| t.cmp(&ms)),
        (Val::Str(text), Val::Time(t)) => rfc3339_ms(text).map(|ms| ms.cmp(t)),
        (Val::Bool(x), Val::Bool(y)) => Some(x.cmp(y)),
        _ => Some(a.as_str()?.cmp(b.as_str()?)),
    }
}

fn num_cmp(a: Num, b: Num) -> Option<Ordering> {
    match (a, b) {
        (Num::Int(x), Num::Int(y)) => Some(x.cmp(&y)),
        (Num::Float(x), Num::Float(y)) => x.partial_cmp(&y),
        (Num::Int(x), Num::Float(y)) => int_float_cmp(x, y),
        (Num::Float(x), Num::Int(y)) => int_float_cmp(y, x).map(Ordering::reverse),
    }
}

/// Compares an integer with a float exactly (converting the integer to a float would round
/// integers above 2^53).
fn int_float_cmp(int: i128, float: f64) -> Option<Ordering> {
    /// 2^127, exactly representable.
    const BOUND: f64 = i128::MAX as f64;
    if float.is_nan() {
        return None;
    }
    if float >= BOUND {
        return Some(Ordering::Less);
    }
    if float < -BOUND {
        return Some(Ordering::Greater);
    }
    let whole = float.floor();
    // |whole| < 2^127, so the conversion is exact.
    let ordering = int.cmp(&(whole as i128));
    Some(ordering.then(if float > whole {
        Ordering::Less
    } else {
        Ordering::Equal
    }))
}

impl Num {
    fn to_f64(self) -> f64 {
        match self {
            Num::Int(n) => n as f64,
            Num::Float(f) => f,
        }
    }
}

fn negate(n: Num) -> Option<Num> {
    match n {
        Num::Int(i) => Some(i.checked_neg().map_or(Num::Float(-(i as f64)), Num::Int)),
        Num::Float(f) => Some(Num::Float(-f)),
    }
}

fn arith<'a>(op: Arith, l: Val<'a>, r: Val<'a>) -> Val<'a> {
    match (l, r) {
        (Val::Num(x), Val::Num(y)) => num_arith(op, x, y).map_or(Val::Null, Val::Num),
        (Val::Time(t), Val::Num(Num::Int(d))) => {
            let t = i128::from(t);
            let moved = match op {
                Arith::Add => t.checked_add(d),
                Arith::Sub => t.checked_sub(d),
                _ => None,
            };
            moved
                .and_then(|ms| i64::try_from(ms).ok())
                .map_or(Val::Null, Val::Time)
        }
        (Val::Num(Num::Int(d)), Val::Time(t)) if op == Arith::Add => {
            arith(op, Val::Time(t), Val::Num(Num::Int(d)))
        }
        (Val::Time(a), Val::Time(b)) if op == Arith::Sub => {
            Val::Num(Num::Int(i128::from(a) - i128::from(b)))
        }
        _ => Val::Null,
    }
}

/// `x op y`: exact on integers where the result is an integer, in floats otherwise; `None`
/// (unknown) for division by zero and results out of range.
fn num_arith(op: Arith, x: Num, y: Num) -> Option<Num> {
    if let (Num::Int(a), Num::Int(b)) = (x, y) {
        let exact = match op {
            Arith::Add => a.checked_add(b),
            Arith::Sub => a.checked_sub(b),
            Arith::Mul => a.checked_mul(b),
            Arith::Div => match a.checked_rem(b) {
                Some(0) => a.checked_div(b),
                _ => None,
            },
            Arith::Rem => a.checked_rem(b),
        };
        if let Some(n) = exact {
            return Some(Num::Int(n));
        }
    }
    let (a, b) = (x.to_f64(), y.to_f64());
    if matches!(op, Arith::Div | Arith::Rem) && b == 0.0 {
        return None;
    }
    let result = match op {
        Arith::Add => a + b,
        Arith::Sub => a - b,
        Arith::Mul => a * b,
        Arith::Div => a / b,
        Arith::Rem => a % b,
    };
    result.is_finite().then_some(Num::Float(result))
}

fn call_function(function: Func, value: Val<'_>) -> Val<'_> {
    match (function, value) {
        (Func::Lower, value) => value
            .as_str()
            .map_or(Val::Null, |text| Val::Str(Cow::Owned(text.to_lowercase()))),
        (Func::Upper, value) => value
            .as_str()
            .map_or(Val::Null, |text| Val::Str(Cow::Owned(text.to_uppercase()))),
        (Func::Length, Val::Json(Value::Array(items))) => Val::Num(Num::Int(items.len() as i128)),
        (Func::Length, value) => value.as_str().map_or(Val::Null, |text| {
            Val::Num(Num::Int(text.chars().count() as i128))
        }),
        (Func::Abs, Val::Num(Num::Int(n))) => Val::Num(
            n.checked_abs()
                .map_or(Num::Float((n as f64).abs()), Num::Int),
        ),
        (Func::Abs, Val::Num(Num::Float(f))) => Val::Num(Num::Float(f.abs())),
        (Func::Abs, _) => Val::Null,
    }
}

// IN ------------------------------------------------------------------------------------------

/// `subject IN (...)`: the same as `subject = a OR subject = b OR ...`, with the constants
/// compiled into a set when they are all strings.
#[derive(Debug)]
struct InList {
    subject: Node,
    constants: Box<[Const]>,
    /// The constants, when every one is a string.
    strings: Option<StrSet>,
    /// Items that are not constants (fields, arithmetic).
    others: Box<[Node]>,
}

#[derive(Debug)]
enum StrSet {
    Few(Box<[Box<str>]>),
    Many(HashSet<Box<str>>),
}

impl StrSet {
    fn of(constants: &[Const]) -> Option<StrSet> {
        let strings: Vec<Box<str>> = constants
            .iter()
            .map(|c| match c {
                Const::Str(text, _) => Some(text.clone()),
                _ => None,
            })
            .collect::<Option<_>>()?;
        Some(if strings.len() >= IN_HASH_MIN {
            StrSet::Many(strings.into_iter().collect())
        } else {
            StrSet::Few(strings.into_boxed_slice())
        })
    }

    fn contains(&self, text: &str) -> bool {
        match self {
            StrSet::Few(strings) => strings.iter().any(|s| **s == *text),
            StrSet::Many(strings) => strings.contains(text),
        }
    }
}

impl InList {
    fn eval<'a>(&'a self, cx: &Context<'a>, item: &'a Item) -> Option<bool> {
        let subject = self.subject.eval(cx, item);
        let mut unknown = false;
        match (&self.strings, subject.as_str()) {
            (Some(strings), Some(text)) => {
                if strings.contains(text) {
                    return Some(true);
                }
            }
            _ => {
                for constant in &self.constants {
                    match compare(&subject, &constant.val()) {
                        Some(Ordering::Equal) => return Some(true),
                        Some(_) => {}
                        None => unknown = true,
                    }
                }
            }
        }
        for other in &self.others {
            match compare(&subject, &other.eval(cx, item)) {
                Some(Ordering::Equal) => return Some(true),
                Some(_) => {}
                None => unknown = true,
            }
        }
        (!unknown).then_some(false)
    }
}

// LIKE ----------------------------------------------------------------------------------------

/// A compiled LIKE pattern. The common shapes are plain string tests; the rest are matched by
/// [`wildcard_match`], written here because no crate in the tree matches SQL LIKE (the regex
/// crate would be a new dependency for some 30 lines).
#[derive(Debug)]
enum Like {
    Exact(Box<str>),
    Prefix(Box<str>),
    Suffix(Box<str>),
    Contains(Box<str>),
    Wild(Box<[Pat]>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pat {
    Char(char),
    /// `_`: one character.
    One,
    /// `%`: any run of characters.
    Many,
}

impl Like {
    fn compile(pattern: &str, escape: Option<char>) -> Result<Like, String> {
        let mut pats = Vec::new();
        let mut chars = pattern.chars();
        while let Some(c) = chars.next() {
            let pat = if Some(c) == escape {
                match chars.next() {
                    Some(next) if next == '%' || next == '_' || Some(next) == escape => {
                        Pat::Char(next)
                    }
                    Some(next) => {
                        return Err(format!(
                            "in the LIKE pattern '{pattern}', the escape character '{c}' must \
                             be followed by %, _ or '{c}', not '{next}'"
                        ));
                    }
                    None => {
                        return Err(format!(
                            "the LIKE pattern '{pattern}' ends with its escape character '{c}'; \
                             escape %, _ or '{c}' with it"
                        ));
                    }
                }
            } else {
                match c {
                    '%' => Pat::Many,
                    '_' => Pat::One,
                    c => Pat::Char(c),
                }
            };
            if !(pat == Pat::Many && pats.last() == Some(&Pat::Many)) {
                pats.push(pat);
            }
        }
        Ok(Like::of(pats))
    }

    fn of(pats: Vec<Pat>) -> Like {
        let leading = pats.first() == Some(&Pat::Many);
        let trailing = pats.len() > usize::from(leading) && pats.last() == Some(&Pat::Many);
        let inner = &pats[usize::from(leading)..pats.len() - usize::from(trailing)];
        let text: Option<String> = inner
            .iter()
            .map(|p| match p {
                Pat::Char(c) => Some(*c),
                _ => None,
            })
            .collect();
        let Some(text) = text else {
            return Like::Wild(pats.into_boxed_slice());
        };
        let text = text.into_boxed_str();
        match (leading, trailing) {
            (false, false) => Like::Exact(text),
            (false, true) => Like::Prefix(text),
            (true, false) => Like::Suffix(text),
            (true, true) => Like::Contains(text),
        }
    }

    fn matches(&self, text: &str) -> bool {
        match self {
            Like::Exact(s) => text == &**s,
            Like::Prefix(s) => text.starts_with(&**s),
            Like::Suffix(s) => text.ends_with(&**s),
            Like::Contains(s) => text.contains(&**s),
            Like::Wild(pats) => wildcard_match(pats, text),
        }
    }
}

/// Matches `text` against `pats`, by characters, without recursion: on a mismatch it returns
/// to the last `%` and lets it take one more character (O(pattern × text) at worst).
fn wildcard_match(pats: &[Pat], text: &str) -> bool {
    let next_char = |at: usize| text.get(at..).and_then(|rest| rest.chars().next());
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    loop {
        let step = match pats.get(p) {
            Some(Pat::Many) => {
                star = Some((p + 1, t));
                p += 1;
                continue;
            }
            Some(Pat::One) => next_char(t),
            Some(Pat::Char(want)) => next_char(t).filter(|c| c == want),
            None if t == text.len() => return true,
            None => None,
        };
        if let Some(c) = step {
            p += 1;
            t += c.len_utf8();
            continue;
        }
        let Some((after_star, star_t)) = star else {
            return false;
        };
        let Some(c) = next_char(star_t) else {
            return false;
        };
        let t_next = star_t + c.len_utf8();
        star = Some((after_star, t_next));
        p = after_star;
        t = t_next;
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use proptest::prelude::*;
    use tributary_event::EventData;

    use super::*;
    use crate::item::Position;

    /// 2026-01-01T00:00:00Z.
    const NEW_YEAR_MS: i64 = 1_767_225_600_000;

    fn context() -> Context<'static> {
        Context {
            partition: "3",
            now_ms: NEW_YEAR_MS + 60_000,
        }
    }

    /// A sensor reading with properties of every type.
    fn reading() -> Item {
        let body = r#"{
            "device": "th-17", "site": "North-1", "ok": true, "missing_value": null,
            "reading": {"temperature": 35.5, "humidity": 40, "unit": "°C"},
            "items": [{"id": "a"}, {"id": "b"}], "count": 9007199254740993,
            "big": 18446744073709551615, "when": "2026-01-01T00:00:00Z", "device id": "x y"
        }"#;
        let mut event = EventData::new(Bytes::from(body))
            .with_property("kind", PropertyValue::String("alarm".into()))
            .with_property("level", PropertyValue::Int32(3))
            .with_property("limit", PropertyValue::UInt64(u64::MAX))
            .with_property("ratio", PropertyValue::Float32(0.5))
            .with_property("score", PropertyValue::Float64(2.25))
            .with_property("retries", PropertyValue::Int64(-2))
            .with_property("urgent", PropertyValue::Bool(true))
            .with_property("nothing", PropertyValue::Null)
            .with_property("raw", PropertyValue::Bytes(Bytes::from_static(b"\x00\x01")))
            .with_property("at", PropertyValue::Timestamp(NEW_YEAR_MS))
            .with_property("my-prop", PropertyValue::String("dashed".into()));
        event.partition_key = Some("device-17".into());
        event.content_type = Some("application/json".into());
        event.message_id = Some("m-1".into());
        Item::new(
            event,
            Position {
                sequence_number: 42,
                offset: 4200,
                enqueued_time_ms: NEW_YEAR_MS + 1_000,
            },
        )
    }

    fn check(text: &str) -> bool {
        let condition = Condition::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
        condition.matches(&context(), &reading())
    }

    fn assert_all(cases: &[(&str, bool)]) {
        for (text, expected) in cases {
            assert_eq!(check(text), *expected, "{text}");
        }
    }

    fn compile_error(text: &str) -> ConditionError {
        match Condition::parse(text) {
            Ok(condition) => panic!("{text} compiled: {condition:?}"),
            Err(error) => error,
        }
    }

    /// Asserts that `text` is refused with a message holding every one of `needles`.
    fn refused(text: &str, needles: &[&str]) {
        let message = compile_error(text).message;
        for needle in needles {
            assert!(
                message.contains(needle),
                "{text}: {message:?} lacks {needle:?}"
            );
        }
    }

    #[test]
    fn names_read_every_scope() {
        assert_all(&[
            ("sys.sequence_number = 42", true),
            ("sys.SequenceNumber = 42", true),
            ("SYS.offset = 4200", true),
            ("sys.partition_id = '3'", true),
            ("sys.partition_key = 'device-17'", true),
            ("sys.content_type = 'application/json'", true),
            ("sys.message_id = 'm-1'", true),
            ("sys.correlation_id IS NULL", true),
            ("user.kind = 'alarm'", true),
            ("USER.kind = 'alarm'", true),
            ("kind = 'alarm'", true),
            ("\"kind\" = 'alarm'", true),
            ("user.\"my-prop\" = 'dashed'", true),
            ("body.device = 'th-17'", true),
            ("body.reading.unit = '°C'", true),
            ("body.items[1].id = 'b'", true),
            ("body.items[0]['id'] = 'a'", true),
            ("body.\"device id\" = 'x y'", true),
            ("body.items[5].id IS NULL", true),
            ("urgent", true),
            ("body.ok", true),
            ("body.device", false),
        ]);
    }

    #[test]
    fn operators_and_literals() {
        assert_all(&[
            (
                "body.reading.humidity = 40 AND body.reading.humidity <> 41",
                true,
            ),
            ("body.reading.humidity != 40", false),
            (
                "level < 4 AND level <= 3 AND level > 2 AND level >= 3",
                true,
            ),
            ("NOT (level = 3)", false),
            ("level = 1 OR level = 3", true),
            ("kind IN ('fault', 'alarm')", true),
            ("kind NOT IN ('fault', 'alarm')", false),
            ("body.reading.temperature BETWEEN 35 AND 36", true),
            ("body.reading.temperature NOT BETWEEN 35 AND 36", false),
            ("body.device LIKE 'th-%'", true),
            ("body.device NOT LIKE 'th-%'", false),
            ("urgent = TRUE AND body.ok <> FALSE", true),
            (
                "urgent IS TRUE AND body.ok IS NOT FALSE AND body.nope IS NOT TRUE",
                true,
            ),
            ("score = 2.25 AND score = 225e-2", true),
            ("retries = -2 AND -retries = 2 AND +level = 3", true),
            ("'it''s' = 'it''s'", true),
            ("TRUE", true),
            ("FALSE OR (TRUE AND NOT FALSE)", true),
        ]);
    }

    #[test]
    fn three_valued_logic() {
        assert_all(&[
            // Comparing with a missing field, a null property or a null JSON value is unknown,
            // and so is its negation.
            ("body.absent = 1", false),
            ("NOT (body.absent = 1)", false),
            ("body.absent <> 1", false),
            ("nothing = 1 OR NOT (nothing = 1)", false),
            (
                "body.missing_value = 1 OR NOT (body.missing_value = 1)",
                false,
            ),
            // Unknown AND false is false (so its negation matches); unknown OR true is true.
            ("NOT (body.absent = 1 AND level = 1)", true),
            ("body.absent = 1 OR level = 3", true),
            ("NOT (body.absent = 1 OR level = 1)", false),
            // A type mismatch is unknown.
            ("kind = 3 OR NOT (kind = 3)", false),
            ("body.reading = 3 OR NOT (body.reading = 3)", false),
            ("raw = 'x' OR NOT (raw = 'x')", false),
            // NULL tests and presence.
            (
                "body.absent IS NULL AND nothing IS NULL AND body.missing_value IS NULL",
                true,
            ),
            ("body.reading IS NOT NULL AND raw IS NOT NULL", true),
            (
                "EXISTS(body.missing_value) AND EXISTS(nothing) AND NOT EXISTS(body.absent)",
                true,
            ),
            (
                "EXISTS(user.kind) AND EXISTS(body.items[1]) AND NOT EXISTS(body.items[2])",
                true,
            ),
            // IN with an unknown item is unknown when nothing equals.
            (
                "kind IN ('x', body.absent) OR NOT (kind IN ('x', body.absent))",
                false,
            ),
            ("kind IN ('alarm', body.absent)", true),
            ("body.absent IN ('a') OR body.absent NOT IN ('a')", false),
            // BETWEEN with a missing bound is unknown unless the other bound decides it.
            ("level BETWEEN body.absent AND 2", false),
            ("NOT (level BETWEEN body.absent AND 2)", true),
            // A field that is not a boolean is not true.
            ("kind OR NOT kind", false),
        ]);
    }

    #[test]
    fn numbers_compare_by_value_across_types() {
        assert_all(&[
            ("level = 3.0 AND level = 3 AND level < 3.5", true),
            ("limit = 18446744073709551615 AND limit = body.big", true),
            ("limit > 9223372036854775807", true),
            ("ratio = 0.5 AND ratio = 1 / 2", true),
            ("score > level - 1 AND retries < 0", true),
            // 2^53 + 1 is not a float; it is compared exactly.
            (
                "body.count = 9007199254740993 AND body.count > 9007199254740992.0",
                true,
            ),
            ("body.count = 9007199254740992", false),
            (
                "body.reading.temperature = 35.5 AND body.reading.humidity = 40.0",
                true,
            ),
            ("99999999999999999999999999999999999999999 > limit", true),
            ("1e300 > limit AND -1e300 < retries", true),
        ]);
    }

    #[test]
    fn strings_compare_as_strings() {
        assert_all(&[
            ("kind < 'b' AND kind > 'a'", true),
            ("body.site = 'north-1'", false),
            (
                "LOWER(body.site) = 'north-1' AND UPPER(body.site) = 'NORTH-1'",
                true,
            ),
            (
                "LENGTH(body.reading.unit) = 2 AND LENGTH(body.items) = 2",
                true,
            ),
            ("LENGTH(body.reading) IS NULL", true),
            ("sys.partition_id = '3' AND sys.partition_id <> '03'", true),
        ]);
    }

    #[test]
    fn like_patterns() {
        let cases = [
            ("abc", "abc", true),
            ("abc", "abd", false),
            ("ab%", "abcdef", true),
            ("%ef", "abcdef", true),
            ("%cd%", "abcdef", true),
            ("%", "", true),
            ("a_c", "abc", true),
            ("a_c", "ac", false),
            ("_", "°", true),
            ("a%b%c", "aXXbYYc", true),
            ("a%b%c", "aXXcYYb", false),
            ("%a%b", "aab", true),
            ("a%%b", "ab", true),
            ("%_%_", "x", false),
            ("°_%", "°C", true),
            ("100!%", "100%", true),
            ("100!%", "1000", false),
            ("a!_b", "a_b", true),
            ("a!_b", "axb", false),
            ("a!!b", "a!b", true),
        ];
        for (pattern, text, expected) in cases {
            let escape = if pattern.contains('!') {
                " ESCAPE '!'"
            } else {
                ""
            };
            let condition = format!("body.value LIKE '{pattern}'{escape}");
            let condition = Condition::parse(&condition).expect("compiles");
            let body = serde_json::json!({ "value": text }).to_string();
            let item = Item::new(EventData::new(body), reading().position());
            assert_eq!(
                condition.matches(&context(), &item),
                expected,
                "{text} LIKE {pattern}"
            );
        }
        assert_all(&[("level LIKE '3'", false), ("NOT (level LIKE '3')", false)]);
    }

    #[test]
    fn in_lists() {
        let many: Vec<String> = (0..40).map(|i| format!("'kind-{i}'")).collect();
        let many = many.join(", ");
        assert_all(&[
            (&format!("kind IN ({many}, 'alarm')"), true),
            (&format!("kind IN ({many})"), false),
            (&format!("kind NOT IN ({many})"), true),
            ("level IN (1, 2.0, 3.0)", true),
            ("level NOT IN (1, 2)", true),
            ("level IN (retries + 5, 7)", true),
            ("urgent IN (TRUE)", true),
            ("sys.enqueued_time IN ('2026-01-01T00:00:01Z', 5)", true),
            ("at IN ('2026-01-01T00:00:00Z')", true),
        ]);
    }

    #[test]
    fn arithmetic() {
        assert_all(&[
            ("level + 1 = 4 AND level - 4 = -1 AND level * 2 = 6", true),
            ("level / 2 = 1.5 AND 7 / 2 = 3.5 AND 6 / 3 = 2", true),
            ("level % 2 = 1 AND score % 1 = 0.25 AND -7 % 3 = -1", true),
            ("1 + 2 * 3 = 7 AND (1 + 2) * 3 = 9 AND 10 - 2 - 3 = 5", true),
            // Division by zero is unknown.
            ("level / 0 = 1 OR NOT (level / 0 = 1)", false),
            ("level % 0 IS NULL AND score / 0.0 IS NULL", true),
            ("ABS(retries) = 2 AND ABS(-2.5) = 2.5", true),
            // Integers beyond i128 carry on in floats.
            ("limit * limit * limit > 1e57", true),
            ("kind + 1 IS NULL", true),
        ]);
    }

    #[test]
    fn times_compare_with_rfc3339_and_milliseconds() {
        assert_all(&[
            ("sys.enqueued_time > '2026-01-01T00:00:00Z'", true),
            ("sys.enqueued_time < '2026-01-01T00:00:00.500Z'", false),
            ("sys.enqueued_time = '2026-01-01T01:00:01+01:00'", true),
            ("sys.enqueued_time > TIMESTAMP '2025-12-31T23:59:59Z'", true),
            ("sys.enqueued_time = 1767225601000", true),
            ("sys.enqueued_time BETWEEN NOW() - 60000 AND NOW()", true),
            ("NOW() - sys.enqueued_time = 59000", true),
            ("sys.enqueued_time + 59000 = NOW()", true),
            // A timestamp property compares as a time, a string field as a string.
            (
                "at = '2026-01-01T00:00:00Z' AND at < sys.enqueued_time",
                true,
            ),
            (
                "body.when = '2026-01-01T00:00:00Z' AND body.when < '2026-01-02'",
                true,
            ),
            ("sys.enqueued_time > body.when", true),
            (
                "sys.enqueued_time > body.device OR NOT (sys.enqueued_time > body.device)",
                false,
            ),
        ]);
    }

    #[test]
    fn a_body_that_is_not_json_has_no_fields() {
        let item = Item::new(EventData::new("<xml/>"), reading().position());
        for (text, expected) in [
            ("body.device = 'th-17'", false),
            ("NOT (body.device = 'th-17')", false),
            ("body.device IS NULL", true),
            ("NOT EXISTS(body) AND NOT EXISTS(body.device)", true),
            ("sys.sequence_number = 42", true),
        ] {
            let condition = Condition::parse(text).expect("compiles");
            assert_eq!(condition.matches(&context(), &item), expected, "{text}");
        }
    }

    #[test]
    fn long_and_or_chains_do_not_count_as_nesting() {
        let clauses: Vec<String> = (0..300).map(|i| format!("level <> {i}")).collect();
        let text = format!("level = 3 OR ({})", clauses[100..].join(" AND "));
        assert!(text.len() <= TEXT_MAX_BYTES, "{}", text.len());
        assert!(check(&text));
        let text = clauses.join(" AND ");
        assert!(text.len() > TEXT_MAX_BYTES);
        refused(&text, &["4096"]);
    }

    #[test]
    fn nesting_up_to_the_bound_compiles() {
        let depth = NESTING_MAX - 2;
        let parens = format!("{}level = 3{}", "(".repeat(depth), ")".repeat(depth));
        assert!(check(&parens));
        let nots = format!("{}level = 3", "NOT ".repeat(depth));
        assert!(check(&nots));
        let calls = format!(
            "{}body.site{} = 'north-1'",
            "LOWER(".repeat(depth - 2),
            ")".repeat(depth - 2)
        );
        assert!(check(&calls));
        let minus = format!("{}level = 3", "- ".repeat(depth));
        assert!(check(&minus));
    }

    #[test]
    fn deep_nesting_is_an_error_not_a_stack_overflow() {
        for text in [
            "(".repeat(10_000),
            format!("{}1{}", "(".repeat(2_000), ")".repeat(2_000)),
            format!("{}level = 3", "NOT ".repeat(1_000)),
            format!("level = {}3", "- ".repeat(2_000)),
            format!("{}1", "LOWER(".repeat(600)),
            format!("{}1", "level IN (".repeat(400)),
            format!("{}1", "EXISTS(".repeat(500)),
            format!("{}1", "CASE WHEN ".repeat(400)),
            format!("{}1", "CAST(".repeat(700)),
            format!("{}1", "ARRAY[".repeat(600)),
            format!("{}1", "a[".repeat(1_300)),
            format!("{}1", "1 + (".repeat(800)),
            format!("{}1", "INTERVAL ".repeat(400)),
            format!("CAST(1 AS {}int", "ARRAY<".repeat(600)),
        ] {
            let text: String = text.chars().take(TEXT_MAX_BYTES).collect();
            let error = compile_error(&text);
            assert!(!error.message.is_empty());
        }
        refused(&"(".repeat(100), &["nests deeper than 64", "column 65"]);
        refused(
            &format!("{}x", "NOT ".repeat(100)),
            &["nests deeper than 64"],
        );
        let sum = vec!["level"; 200].join(" + ");
        refused(&format!("{sum} = 1"), &["nests deeper than 64"]);
    }

    #[test]
    fn unknown_names_and_functions_are_refused_with_what_exists() {
        refused("", &["empty"]);
        refused("   ", &["empty"]);
        refused(
            "sys.nope = 1",
            &["sys.nope", "sys.sequence_number", "sys.correlation_id"],
        );
        refused("sys = 1", &["sys.<name>"]);
        refused("sys.a.b = 1", &["sys.<name>"]);
        refused("user = 1", &["user.<name>"]);
        refused("user.a.b = 1", &["user.<name>", "user.\"my-prop\""]);
        refused("device.kind = 1", &["sys., user. or body."]);
        refused("FOO(kind)", &["FOO", "EXISTS(field)", "LOWER(text)"]);
        refused("LOWER(kind, 'x') = 'a'", &["LOWER takes 1 argument, not 2"]);
        refused("NOW(1) = 1", &["NOW takes 0 arguments, not 1"]);
        refused("EXISTS(1)", &["EXISTS takes a field"]);
        refused("COUNT(DISTINCT kind) = 1", &["not a call"]);
        refused("body.items[-1] = 1", &["array index"]);
        refused("body.items[kind] = 1", &["array index"]);
    }

    #[test]
    fn constructs_outside_the_language_are_refused() {
        refused("EXISTS(SELECT 1)", &["subqueries are not part"]);
        refused("kind IN (SELECT 1)", &["IN takes a list"]);
        refused("CASE WHEN kind = 'a' THEN TRUE END", &["CASE is not part"]);
        refused("CAST(level AS INT) = 3", &["CAST is not part"]);
        refused("kind ILIKE 'a%'", &["LOWER(x) LIKE"]);
        refused(
            "kind || 'x' = 'ax'",
            &["operator || is not supported", "AND OR NOT"],
        );
        refused("kind = ?", &["parameters such as ?"]);
        refused(
            "kind = 'a' kind = 'b'",
            &["column 12", "unexpected `kind`", "AND or OR"],
        );
        refused("kind = 'a';", &["unexpected `;`"]);
        refused(
            "kind = ",
            &["Expected: an expression", "the end of the condition"],
        );
        refused("kind = 'unterminated", &["column 8", "Unterminated string"]);
        refused("level = 1e999", &["out of range"]);
        refused("level = x'00'", &["not a literal"]);
    }

    #[test]
    fn comparisons_that_never_hold_and_type_errors_are_refused() {
        refused("kind = NULL", &["IS NULL"]);
        refused("kind IN ('a', NULL)", &["IS NULL"]);
        refused("NULL + 1 = 1", &["arithmetic"]);
        refused(
            "sys.sequence_number = '42'",
            &["a number with a string", "42 without quotes"],
        );
        refused("sys.partition_id > 3", &["a string with a number"]);
        refused("'a' = TRUE", &["a string with a true/false value"]);
        refused(
            "sys.enqueued_time > 'yesterday'",
            &["'yesterday'", "RFC 3339"],
        );
        refused("sys.enqueued_time IN ('yesterday')", &["RFC 3339"]);
        refused(
            "TIMESTAMP 'soon' = sys.enqueued_time",
            &["'soon'", "RFC 3339"],
        );
        refused("DATE '2026-01-01' = sys.enqueued_time", &["TIMESTAMP"]);
        refused("kind LIKE body.pattern", &["quoted pattern"]);
        refused("kind LIKE 'a!b' ESCAPE '!'", &["followed by %, _ or '!'"]);
        refused("kind LIKE 'ab!' ESCAPE '!'", &["ends with its escape"]);
        refused("kind LIKE 'a' ESCAPE '!!'", &["one quoted character"]);
        refused("sys.offset + 1 LIKE 'a'", &["LIKE matches strings"]);
        refused("sys.offset LIKE '1%'", &["a number"]);
        refused("NOT sys.offset + 1", &["is a number, not true or false"]);
        refused("sys.offset + 1", &["not true or false"]);
        refused("'x'", &["not true or false"]);
        refused("kind + 'x' = 1", &["arithmetic works on numbers"]);
        refused("sys.enqueued_time * 2 > 1", &["arithmetic"]);
        refused("-kind = 1 AND -'a' = 1", &["takes a number"]);
        refused("LOWER(sys.offset) = 'a'", &["LOWER takes a string"]);
        refused("ABS('a') = 1", &["ABS takes a number"]);
    }

    #[test]
    fn errors_say_where() {
        let error = compile_error("kind = 'a' AND\n  sys.nope = 1");
        assert_eq!((error.line, error.column), (Some(2), Some(3)));
        assert!(
            error.message.starts_with("at line 2, column 3:"),
            "{}",
            error.message
        );
        let error = compile_error("level = 1 AND sys.nope = 1");
        assert_eq!((error.line, error.column), (Some(1), Some(15)));
        assert!(
            error.message.starts_with("at column 15:"),
            "{}",
            error.message
        );
        refused(
            &"x".repeat(TEXT_MAX_BYTES + 1),
            &["4097 bytes", "at most 4096"],
        );
    }

    #[test]
    fn a_condition_keeps_its_text_and_is_shared_across_threads() {
        fn shared<T: Clone + fmt::Debug + Send + Sync>(_: &T) {}
        let condition = Condition::parse("kind = 'alarm'").expect("compiles");
        shared(&condition);
        assert_eq!(condition.text(), "kind = 'alarm'");
        assert_eq!(condition.to_string(), "kind = 'alarm'");
        assert!(format!("{condition:?}").contains("kind = 'alarm'"));
        let copy = condition.clone();
        let matched = std::thread::spawn(move || copy.matches(&context(), &reading()))
            .join()
            .expect("joins");
        assert!(matched);
    }

    /// `shape(n)` for the largest `n` that passes the nesting check within the length bound,
    /// and `shape(n + 1)` if that is within the length bound (so refused for nesting).
    fn deepest(shape: &dyn Fn(usize) -> String) -> (String, Option<String>) {
        let passes = |text: &str| {
            let tokens = Tokenizer::new(&ConditionDialect, text).tokenize_with_location();
            check_nesting(&tokens.expect("tokens")).is_ok()
        };
        let mut n = 1;
        while shape(n + 1).len() <= TEXT_MAX_BYTES && passes(&shape(n + 1)) {
            n += 1;
        }
        let next = shape(n + 1);
        (shape(n), (next.len() <= TEXT_MAX_BYTES).then_some(next))
    }

    /// Every shape of nesting sqlparser recurses on, as deep as the nesting check lets through,
    /// compiles (or is refused) without overflowing the stack in a debug build, where
    /// sqlparser's frames are largest; one level deeper is refused before sqlparser runs.
    #[test]
    fn every_shape_at_the_nesting_bound_compiles_without_overflowing_the_stack() {
        type Shape = Box<dyn Fn(usize) -> String>;
        let shapes: Vec<Shape> = vec![
            Box::new(|n| format!("{}1{}", "(".repeat(n), ")".repeat(n))),
            Box::new(|n| format!("{}x", "NOT ".repeat(n))),
            Box::new(|n| format!("{}x", "- ".repeat(n))),
            Box::new(|n| format!("{}x{}", "LOWER(".repeat(n), ")".repeat(n))),
            Box::new(|n| format!("{}x{}", "EXISTS(".repeat(n), ")".repeat(n))),
            Box::new(|n| format!("{}x{}", "x IN (".repeat(n), ")".repeat(n))),
            Box::new(|n| format!("{}x{}", "CAST(".repeat(n), " AS INT)".repeat(n))),
            Box::new(|n| format!("{}x{}", "CASE WHEN ".repeat(n), " THEN 1 END".repeat(n))),
            Box::new(|n| {
                format!(
                    "{}x{}",
                    "(a OR b AND c = d + e * - ".repeat(n),
                    ")".repeat(n)
                )
            }),
            Box::new(|n| format!("{}x", "a OR b AND NOT c = d + e * - ".repeat(n))),
            Box::new(|n| format!("a{}1{}", "[a[".repeat(n), "]]".repeat(n))),
            Box::new(|n| format!("{}1{}", "ARRAY[".repeat(n), "]".repeat(n))),
            Box::new(|n| format!("{}1", "INTERVAL ".repeat(n))),
            Box::new(|n| format!("CAST(1 AS {}INT{})", "ARRAY<".repeat(n), ">".repeat(n))),
            Box::new(|n| format!("{}1{}", "x = (NOT EXISTS(".repeat(n), "))".repeat(n))),
            Box::new(|n| format!("{}'a'", "x NOT LIKE - ".repeat(n))),
            Box::new(|n| format!("{}1", "x IS NOT ".repeat(n))),
        ];
        let mut refused_deeper = 0;
        for shape in shapes {
            let (text, deeper) = deepest(&*shape);
            let _ = Condition::parse(&text);
            if let Some(deeper) = deeper {
                refused(&deeper, &["nests deeper than 64"]);
                refused_deeper += 1;
            }
        }
        assert!(refused_deeper >= 12, "{refused_deeper}");
    }

    /// Tokens for SQL-ish soup.
    const SOUP: &[&str] = &[
        "(",
        ")",
        "[",
        "]",
        ",",
        ".",
        "=",
        "<>",
        "!=",
        "<",
        "<=",
        ">",
        ">=",
        "+",
        "-",
        "*",
        "/",
        "%",
        "||",
        "AND",
        "OR",
        "NOT",
        "IS",
        "NULL",
        "TRUE",
        "FALSE",
        "IN",
        "LIKE",
        "ESCAPE",
        "BETWEEN",
        "EXISTS",
        "LOWER",
        "UPPER",
        "LENGTH",
        "ABS",
        "NOW",
        "CASE",
        "WHEN",
        "THEN",
        "END",
        "CAST",
        "AS",
        "SELECT",
        "TIMESTAMP",
        "INTERVAL",
        "user",
        "sys",
        "body",
        "kind",
        "sys.sequence_number",
        "sys.enqueued_time",
        "body.a.b",
        "body.items[0]",
        "user.\"x\"",
        "'a'",
        "'%_'",
        "'!'",
        "'2026-01-01T00:00:00Z'",
        "0",
        "1",
        "-1",
        "2.5",
        "1e3",
        "\"",
        "'",
        "?",
        "$1",
        ";",
        "--",
        "/*",
        "ARRAY",
        "<",
        "::",
        "@",
        "~",
    ];

    fn soup() -> impl Strategy<Value = String> {
        proptest::collection::vec(proptest::sample::select(SOUP), 0..60)
            .prop_map(|tokens| tokens.join(" "))
    }

    /// Events with bodies and properties of any shape.
    fn event() -> impl Strategy<Value = Item> {
        let json = proptest::collection::vec(any::<u8>(), 0..64).prop_map(|bytes| bytes);
        let structured =
            (any::<i64>(), any::<f64>(), ".{0,8}", any::<bool>()).prop_map(|(n, f, s, b)| {
                serde_json::json!({"a": {"b": n}, "items": [f, s.clone(), b], "kind": s, "n": f})
                    .to_string()
                    .into_bytes()
            });
        let body = prop_oneof![json, structured];
        let value = prop_oneof![
            Just(PropertyValue::Null),
            any::<bool>().prop_map(PropertyValue::Bool),
            any::<i32>().prop_map(PropertyValue::Int32),
            any::<u64>().prop_map(PropertyValue::UInt64),
            any::<f32>().prop_map(PropertyValue::Float32),
            any::<f64>().prop_map(PropertyValue::Float64),
            ".{0,8}".prop_map(|s| PropertyValue::String(s.into())),
            any::<i64>().prop_map(PropertyValue::Timestamp),
            any::<[u8; 16]>().prop_map(PropertyValue::Uuid),
        ];
        (body, value, any::<i64>(), any::<u64>(), any::<i64>()).prop_map(
            |(body, value, sequence_number, offset, enqueued_time_ms)| {
                let event = EventData::new(body)
                    .with_property("kind", value.clone())
                    .with_property("x", value);
                Item::new(
                    event,
                    Position {
                        sequence_number,
                        offset,
                        enqueued_time_ms,
                    },
                )
            },
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn parse_never_panics_on_arbitrary_text(text in "\\PC{0,120}") {
            let _ = Condition::parse(&text);
        }

        #[test]
        fn parse_never_panics_on_sql_soup(text in soup()) {
            if let Ok(condition) = Condition::parse(&text) {
                let _ = condition.matches(&context(), &reading());
            }
        }

        #[test]
        fn matches_never_panics_on_arbitrary_events(item in event(), now in any::<i64>()) {
            let context = Context { partition: "0", now_ms: now };
            for text in [
                "kind = 'a' OR kind > 1 OR kind IN ('a', 'b', 1.5) OR kind LIKE '%a_'",
                "x + 1 > x * 2 - x / 3 % 7 OR -x = ABS(x) OR LENGTH(x) = 1",
                "body.a.b BETWEEN -1 AND 1e20 OR body.items[0] >= body.n OR body.items[2] IS TRUE",
                "sys.enqueued_time + x > NOW() - 1 OR sys.sequence_number * sys.offset < x",
                "LOWER(body.kind) = UPPER(body.kind) OR EXISTS(body.items[1]) OR x IS NULL",
                "x = '2026-01-01T00:00:00Z' OR sys.enqueued_time = x OR LENGTH(body.items) = x",
            ] {
                let condition = Condition::parse(text).expect("compiles");
                let _ = condition.matches(&context, &item);
            }
        }
    }
}
