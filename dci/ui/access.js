"use strict";
/*
 * Disbatch operator console — the access token. With `web.tokens` set, the API wants
 * `Authorization: Bearer <token>`: app.js's send() adds it to every call, and a 401 opens
 * the prompt here (#token-form in index.html). The token is kept in sessionStorage, so it
 * lasts as long as the tab and goes to this server only.
 */

const TOKEN_KEY = "disbatch.token";
let memoryToken = "";   // used when the browser refuses sessionStorage

function storedToken() {
  try {
    return sessionStorage.getItem(TOKEN_KEY) || "";
  } catch (e) {
    return memoryToken;
  }
}

function storeToken(token) {
  memoryToken = token;
  try {
    if (token) sessionStorage.setItem(TOKEN_KEY, token);
    else sessionStorage.removeItem(TOKEN_KEY);
  } catch (e) { /* memoryToken holds it */ }
  document.getElementById("token-clear").hidden = !token;
}

function withToken(headers) {
  const token = storedToken();
  if (token) headers.Authorization = `Bearer ${token}`;
  return headers;
}

/** Shows the token prompt; the field keeps anything being typed when polling asks again. */
function askToken(reason) {
  const form = document.getElementById("token-form");
  const rejected = storedToken() !== "";
  showMsg(document.getElementById("token-msg"),
    rejected ? `The token was refused (${reason}). Enter another.` :
      "This server needs an access token. Enter yours to continue.",
    rejected ? "error" : "hint");
  if (form.hidden) {
    form.hidden = false;
    document.getElementById("token-input").focus();
  }
}

function submitToken(e) {
  e.preventDefault();
  const input = document.getElementById("token-input");
  const token = input.value.trim();
  if (!token) {
    showMsg(document.getElementById("token-msg"), "Enter a token first.", "error");
    return;
  }
  storeToken(token);
  input.value = "";
  document.getElementById("token-form").hidden = true;
  infoLoaded = false;
  refreshNow();
}

function forgetToken() {
  storeToken("");
  infoLoaded = false;
  refreshNow();
}
