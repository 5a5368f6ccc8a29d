//! The model's own chat template (Jinja, as Hugging Face's `apply_chat_template` renders it)
//! turned into a prompt string.

use minijinja::{context, Environment, Error as JinjaError, ErrorKind};
use serde::Serialize;
use veil_core::{Error, Result};

/// One turn of a conversation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ChatMessage {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// What was said.
    pub content: String,
}

impl ChatMessage {
    /// A turn by `role`.
    pub fn new(role: &str, content: &str) -> Self {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// A compiled chat template with the special-token strings it may refer to.
#[derive(Clone, Debug)]
pub struct ChatTemplate {
    source: String,
    template: String,
    bos_token: String,
    eos_token: String,
}

impl ChatTemplate {
    /// Checks that `template` parses; `source` names the file in errors.
    pub fn new(
        template: String,
        bos_token: String,
        eos_token: String,
        source: &str,
    ) -> Result<Self> {
        let t = ChatTemplate {
            source: source.to_string(),
            template,
            bos_token,
            eos_token,
        };
        t.environment().map_err(|e| t.error("does not parse", e))?;
        Ok(t)
    }

    /// The Jinja source (for writing `tokenizer_config.json` again).
    pub fn template(&self) -> &str {
        &self.template
    }

    /// The BOS token string the template may use.
    pub fn bos_token(&self) -> &str {
        &self.bos_token
    }

    /// The EOS token string the template may use.
    pub fn eos_token(&self) -> &str {
        &self.eos_token
    }

    fn error(&self, what: &str, e: JinjaError) -> Error {
        Error::Malformed(format!("{}: chat template {what}: {e:#}", self.source))
    }

    /// Hugging Face renders with `trim_blocks` and `lstrip_blocks` and offers
    /// `raise_exception(msg)`; Python string methods (`.strip()`, …) come from pycompat.
    fn environment(&self) -> std::result::Result<Environment<'_>, JinjaError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |msg: String| -> std::result::Result<String, JinjaError> {
                Err(JinjaError::new(ErrorKind::InvalidOperation, msg))
            },
        );
        env.add_template("chat", &self.template)?;
        Ok(env)
    }

    /// The prompt for `messages`, ending with the assistant's opening when
    /// `add_generation_prompt`.
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        let env = self
            .environment()
            .map_err(|e| self.error("does not parse", e))?;
        let template = env
            .get_template("chat")
            .map_err(|e| self.error("is missing", e))?;
        template
            .render(context! {
                messages => messages,
                add_generation_prompt => add_generation_prompt,
                bos_token => &self.bos_token,
                eos_token => &self.eos_token,
            })
            .map_err(|e| self.error("failed", e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(template: &str, messages: &[ChatMessage]) -> Result<String> {
        ChatTemplate::new(template.into(), "<s>".into(), "</s>".into(), "test")?
            .render(messages, true)
    }

    #[test]
    fn templates_get_hugging_face_s_environment() {
        let user = [ChatMessage::new("user", "  hi  ")];
        // Block tags eat their newline (trim_blocks) and leading spaces (lstrip_blocks).
        let t = "{{ bos_token }}\n  {% for m in messages %}\n[{{ m.role }}] {{ m.content.strip() }}\n  {% endfor %}\n{% if add_generation_prompt %}>{% endif %}";
        assert_eq!(render(t, &user).unwrap(), "<s>\n[user] hi\n>");
        let raising =
            "{% if messages[0].role != 'system' %}{{ raise_exception('system first') }}{% endif %}";
        let e = render(raising, &user).unwrap_err().to_string();
        assert!(e.contains("system first") && e.contains("test"), "{e}");
        assert!(
            ChatTemplate::new("{% for %}".into(), String::new(), String::new(), "f.json").is_err()
        );
    }
}
