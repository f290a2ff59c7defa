// phi-api's playground: a chat with the server's own OpenAI API, streamed, in plain JavaScript (no build step).
// Model output is rendered as Markdown by markdown-it with raw HTML off, and the page's Content-Security-Policy
// forbids inline scripts: nothing a model or a prompt writes runs as code.
"use strict";

(() => {
  const KEY_STORAGE = "phi-api-key";
  const $ = (id) => document.getElementById(id);
  const markdown = window.markdownit({ html: false, linkify: false, breaks: true });
  const state = { history: [], controller: null };

  function apiKey() {
    return localStorage.getItem(KEY_STORAGE) || "";
  }

  function headers() {
    const result = { "Content-Type": "application/json" };
    if (apiKey()) result.Authorization = "Bearer " + apiKey();
    return result;
  }

  function showNotice(text) {
    $("notice").textContent = text;
    $("notice").hidden = !text;
  }

  function askForKey() {
    $("key-input").value = apiKey();
    if (!$("key-dialog").open) $("key-dialog").showModal();
  }

  async function errorText(response) {
    // The server always answers errors with OpenAI's error object; say what it says.
    try {
      const body = await response.json();
      const message = body.error && (body.error.message || body.error);
      if (message) return `${response.status}: ${message}`;
    } catch (ignored) { /* not JSON: fall through */ }
    return `${response.status} ${response.statusText}`;
  }

  async function loadModels() {
    let response;
    try {
      response = await fetch("/v1/models", { headers: headers() });
    } catch (error) {
      showNotice("Cannot reach the server: " + error.message);
      return;
    }
    if (response.status === 401) {
      askForKey();
      return;
    }
    if (!response.ok) {
      showNotice("Cannot list the models: " + (await errorText(response)));
      return;
    }
    const { data } = await response.json();
    const select = $("model");
    select.replaceChildren(...data.map((model) => {
      const option = document.createElement("option");
      option.value = option.textContent = model.id;
      return option;
    }));
    showNotice("");
  }

  function bubble(role) {
    const element = document.createElement("article");
    element.className = "message " + role;
    const body = document.createElement("div");
    body.className = "body";
    element.append(body);
    $("messages").append(element);
    element.scrollIntoView({ block: "end" });
    return element;
  }

  function addUserMessage(text) {
    bubble("user").querySelector(".body").textContent = text;  // the prompt, as text, never as HTML
  }

  function render(element, text) {
    element.querySelector(".body").innerHTML = markdown.render(text);  // raw HTML escaped by markdown-it
    element.scrollIntoView({ block: "end" });
  }

  function describe(element, { usage, metrics, finishReason, note }) {
    const meta = document.createElement("p");
    meta.className = "meta";
    const parts = [];
    if (finishReason) parts.push(`finish: ${finishReason}`);
    if (usage) parts.push(`tokens: ${usage.prompt_tokens} in, ${usage.completion_tokens} out`);
    if (metrics) parts.push(`ttft ${Math.round(metrics.ttft * 1000)} ms`, `${metrics.decode_throughput.toFixed(1)} tok/s`);
    meta.textContent = parts.join(" · ");
    element.append(meta);
    if (note) {
      const warning = document.createElement("p");
      warning.className = "note";
      warning.textContent = note;
      element.append(warning);
    }
  }

  function request() {
    const system = $("system").value.trim();
    const body = {
      model: $("model").value,
      messages: (system ? [{ role: "system", content: system }] : []).concat(state.history),
      stream: true,
      stream_options: { include_usage: true },
      temperature: Number($("temperature").value),
      top_p: Number($("top-p").value),
    };
    if ($("max-tokens").value) body.max_tokens = Number($("max-tokens").value);
    if ($("seed").value) body.seed = Number($("seed").value);
    return body;
  }

  async function* events(response) {
    // Server-sent events: blocks separated by a blank line; "data:" lines carry JSON, then "[DONE]".
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += decoder.decode(value, { stream: true });
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        for (const line of block.split("\n")) {
          if (!line.startsWith("data: ")) continue;
          const data = line.slice(6);
          if (data === "[DONE]") return;
          yield JSON.parse(data);
        }
      }
    }
  }

  function setBusy(busy) {
    $("send").hidden = busy;
    $("stop").hidden = !busy;
    $("prompt").disabled = busy;
  }

  async function send(text) {
    showNotice("");
    state.history.push({ role: "user", content: text });
    addUserMessage(text);
    const answer = bubble("assistant");
    answer.querySelector(".body").textContent = "…";
    const controller = new AbortController();
    state.controller = controller;
    setBusy(true);
    let content = "";
    let outcome = {};
    try {
      const response = await fetch("/v1/chat/completions", {
        method: "POST", headers: headers(), body: JSON.stringify(request()), signal: controller.signal,
      });
      if (response.status === 401) askForKey();
      if (!response.ok) throw new Error(await errorText(response));
      for await (const chunk of events(response)) {
        if (chunk.error) throw new Error(chunk.error.message || "the server could not finish the answer");
        for (const choice of chunk.choices || []) {
          if (choice.delta && choice.delta.content) {
            content += choice.delta.content;
            render(answer, content);
          }
          if (choice.finish_reason) outcome.finishReason = choice.finish_reason;
        }
        if (chunk.usage) outcome.usage = chunk.usage;
        if (chunk.metrics) outcome.metrics = chunk.metrics;
      }
      if (outcome.finishReason === "length") {
        outcome.note = "The answer was cut short: it reached max_tokens.";
      }
      render(answer, content);
      state.history.push({ role: "assistant", content });
    } catch (error) {
      if (controller.signal.aborted) {
        outcome = { finishReason: "stopped", note: "Stopped: the server cancelled the generation." };
        render(answer, content);
        if (content) state.history.push({ role: "assistant", content });
      } else {
        answer.classList.add("failed");
        const lost = error instanceof TypeError;  // fetch's way of saying the connection is gone
        answer.querySelector(".body").textContent = lost ? "Connection lost: " + error.message : error.message;
        state.history.pop();  // the question goes unanswered: let it be asked again
      }
    } finally {
      describe(answer, outcome);
      state.controller = null;
      setBusy(false);
      $("prompt").focus();
    }
  }

  function bind() {
    $("composer").addEventListener("submit", (event) => {
      event.preventDefault();
      const text = $("prompt").value.trim();
      if (!text || state.controller) return;
      $("prompt").value = "";
      send(text);
    });
    $("prompt").addEventListener("keydown", (event) => {
      if (event.key === "Enter" && !event.shiftKey) {
        event.preventDefault();
        $("composer").requestSubmit();
      }
    });
    $("stop").addEventListener("click", () => state.controller && state.controller.abort());
    $("new-chat").addEventListener("click", () => {
      if (state.controller) state.controller.abort();
      state.history = [];
      $("messages").replaceChildren();
      showNotice("");
    });
    $("toggle-settings").addEventListener("click", () => {
      const open = document.body.classList.toggle("settings-open");
      $("toggle-settings").setAttribute("aria-expanded", String(open));
    });
    for (const [input, output] of [["temperature", "temperature-value"], ["top-p", "top-p-value"]]) {
      $(input).addEventListener("input", () => { $(output).textContent = $(input).value; });
    }
    $("key").value = apiKey();
    $("key").addEventListener("change", () => {
      localStorage.setItem(KEY_STORAGE, $("key").value.trim());
      loadModels();
    });
    $("key-form").addEventListener("submit", () => {
      localStorage.setItem(KEY_STORAGE, $("key-input").value.trim());
      $("key").value = apiKey();
      loadModels();
    });
  }

  bind();
  loadModels();
})();
