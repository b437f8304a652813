// Keeps a server-rendered page live. The page names its Server-Sent Events
// stream in `data-live`; each `fragment` event carries an element id on its
// first line and that element's new HTML after it, rendered by the same code
// as the page. Without this script every page still works; it is just not live.
(function () {
  'use strict';
  var main = document.querySelector('[data-live]');
  if (!main || !window.EventSource) return;
  var note = document.getElementById('live-state');
  var pending = {};

  function say(text, state) {
    if (!note) return;
    note.textContent = text;
    note.setAttribute('data-state', state);
  }

  function apply(id, html) {
    var target = document.getElementById(id);
    if (!target) return;
    // Never swap an element out from under the keyboard focus: keep the
    // newest HTML and apply it when the focus leaves.
    var focused = document.activeElement;
    if (focused && focused !== document.body && target.contains(focused)) {
      pending[id] = html;
      return;
    }
    target.outerHTML = html;
  }

  document.addEventListener('focusout', function () {
    setTimeout(function () {
      var ids = Object.keys(pending);
      ids.forEach(function (id) {
        var html = pending[id];
        delete pending[id];
        apply(id, html);
      });
    }, 0);
  });

  var source = new EventSource(main.getAttribute('data-live'));
  source.addEventListener('open', function () { say('● Live: this page updates by itself.', 'live'); });
  source.addEventListener('error', function () { say('Reconnecting to live updates…', 'reconnecting'); });
  source.addEventListener('fragment', function (event) {
    var split = event.data.indexOf('\n');
    if (split < 0) return;
    apply(event.data.slice(0, split), event.data.slice(split + 1));
  });
  source.addEventListener('signout', function () {
    source.close();
    window.location.reload();
  });
  source.addEventListener('gone', function (event) {
    source.close();
    say(event.data + '; live updates stopped.', 'gone');
  });
})();
