;;; opencortex-stream.el --- Turns and streamed replies in the chat buffer  -*- lexical-binding: t; -*-

;; This file is part of opencortex.
;; SPDX-License-Identifier: GPL-3.0-or-later

;;; Commentary:

;; A turn is in flight from the moment the kernel acknowledges a message
;; (`send-message' returns its turn id) or streams text for it, until it ends:
;; `opencortex-stream' with kind "end" or "abort", `opencortex-status-changed'
;; with that :turn-id, or the kernel dying.  Finished turn ids are remembered
;; for the whole session, so nothing of a finished turn is ever shown again
;; (after a reconnect, say).
;;
;; Streamed text goes into a region of its own per turn.  Chunks are
;; coalesced: the buffer changes at most once per `opencortex-stream-interval'
;; (the first chunk after a quiet interval at once, the rest by a timer), so a
;; fast model costs at most ~30 buffer updates a second.  "reset" removes the
;; region (the reply was rejected and a retry streams anew); "end" replaces
;; the region with the final text; "abort" removes it and shows the reason.
;;
;; A reasoning model's thinking ("thinking" events) streams into a block of
;; its own above the reply, `#+begin_thinking' ... `#+end_thinking', drawn
;; line by line: what the model wrote is made inert there (controls
;; visible, org links broken, no line that org would read as a heading or
;; that could end the block), and the line still streaming is drawn again
;; as it grows.  When the reply comes the block is folded (or removed, or
;; never shown: `opencortex-show-thinking'); "reset" and "abort" remove it
;; with the text.

;;; Code:

(require 'cl-lib)
(require 'subr-x)
(require 'opencortex-chat)

(defcustom opencortex-stream-interval 0.033
  "Least time in seconds between two updates of the chat buffer by a stream."
  :type 'number
  :group 'opencortex)

(defcustom opencortex-show-thinking t
  "Whether a reasoning model's thinking shows in the chat buffer.
t: it streams into a thinking block above the reply, folded once the
reply comes (TAB on its first line unfolds it); `streaming': shown
while it streams, removed when the reply comes; nil: never shown.
Thinking is never archived nor sent to the model again."
  :type '(choice (const :tag "Kept, folded" t)
                 (const :tag "Only while the model thinks" streaming)
                 (const :tag "Never" nil))
  :group 'opencortex)

(defconst opencortex--thinking-line-limit 1000
  "Characters of the thinking line still streaming redrawn as it grows, at most.
A longer line is broken there, so a model thinking without line breaks
costs each update a bounded redraw, not one growing with all it thought.")

(defvar opencortex--turns-in-flight (make-hash-table :test #'equal)
  "Turn ids (strings) of the turns that have started and not ended.")

(defvar opencortex--finished-turns (make-hash-table :test #'equal)
  "Turn ids of ended turns: later events for them are ignored.")

(defvar opencortex--streams (make-hash-table :test #'equal)
  "Open streamed regions by turn id (`opencortex--stream' objects).")

(defvar opencortex--flush-timer nil
  "Timer that will write pending streamed text, or nil.")

(defvar opencortex--last-flush 0.0
  "`float-time' of the latest stream update of the buffer.")

(defvar opencortex--stream-updates 0
  "How many times streamed text was written into the buffer (for benchmarks).")

(cl-defstruct (opencortex--stream (:constructor opencortex--make-stream (turn-id))
                                  (:copier nil))
  "The streamed region of one turn, and its THINKING block (or nil)."
  turn-id start end pending thinking)

(cl-defstruct (opencortex--thinking (:constructor opencortex--make-thinking)
                                    (:copier nil))
  "The thinking block of a turn, and what of it is still to be drawn.
Markers: START (its first line), TAIL (where the line still streaming is
drawn), STOP (before its end line) and CLOSE (after it).  LINE is the raw
text of the line still streaming; PENDING, pieces not yet drawn (newest
first)."
  start tail stop close (line "") pending)

;;;; Turns

(defun opencortex--turn-finished-p (turn-id)
  "Whether TURN-ID has ended."
  (gethash turn-id opencortex--finished-turns))

(defun opencortex--turn-started (turn-id)
  "Count TURN-ID as in flight (unless it already ended)."
  (when (and (stringp turn-id) (not (opencortex--turn-finished-p turn-id)))
    (puthash turn-id t opencortex--turns-in-flight)))

(defun opencortex--finish-turn (turn-id)
  "Mark TURN-ID ended and ask the kernel for the new status."
  (remhash turn-id opencortex--turns-in-flight)
  (puthash turn-id t opencortex--finished-turns)
  (opencortex--refresh-status))

(defun opencortex--turns-busy-p ()
  "Whether a turn is in flight or streamed text waits to be written."
  (or (> (hash-table-count opencortex--turns-in-flight) 0)
      (timerp opencortex--flush-timer)))

;;;; Streamed regions

(defun opencortex--stream-live-p (stream)
  "Whether STREAM has a region in the live chat buffer."
  (let ((start (opencortex--stream-start stream)))
    (and (markerp start)
         (buffer-live-p (marker-buffer start))
         (eq (marker-buffer start) (get-buffer opencortex-chat-buffer-name)))))

(defun opencortex--stream-end-at-p (position)
  "Whether an open streamed region ends at POSITION."
  (catch 'found
    (maphash (lambda (_ stream)
               (when (and (opencortex--stream-live-p stream)
                          (= (opencortex--stream-end stream) position))
                 (throw 'found t)))
             opencortex--streams)
    nil))

(defun opencortex--stream-write (stream)
  "Write the pending text of STREAM at the end of its region (made when missing)."
  (let ((text (apply #'concat (nreverse (opencortex--stream-pending stream)))))
    (setf (opencortex--stream-pending stream) nil)
    (opencortex--with-output
     (lambda ()
       (if (opencortex--stream-live-p stream)
           (goto-char (opencortex--stream-end stream))
         (opencortex--fresh-line)
         (when (opencortex--stream-end-at-p (point))
           (insert (opencortex--read-only "\n")))
         (setf (opencortex--stream-start stream) (point-marker)
               (opencortex--stream-end stream) (point-marker)))
       (let ((beg (point)))
         (insert (opencortex--read-only (opencortex--visible text)))
         (set-marker (opencortex--stream-end stream) (point))
         (setq opencortex--last-output-kind 'stream)
         (cl-incf opencortex--stream-updates)
         (opencortex--changed beg (point)))))))

(defun opencortex--flush-streams ()
  "Write all pending streamed text (and thinking) into the buffer now."
  (when (timerp opencortex--flush-timer)
    (cancel-timer opencortex--flush-timer))
  (setq opencortex--flush-timer nil
        opencortex--last-flush (float-time))
  (maphash (lambda (_ stream)
             (let ((thinking (opencortex--stream-thinking stream)))
               (when (and thinking (opencortex--thinking-pending thinking))
                 (opencortex--thinking-write thinking)))
             (when (opencortex--stream-pending stream)
               (opencortex--stream-write stream)))
           opencortex--streams))

;;;; Thinking blocks

(defun opencortex--thinking-inert (text)
  "TEXT, lines a model thought, as the inside of a thinking block.
Controls become visible and org links are broken; a line starting with
\"*\" gets a space before it (a list item or text, never a heading), and
one that org would read as a keyword or block line (\"#+\", maybe
indented or after commas) gets org's comma escape, so nothing inside
can end the block."
  (let* ((text (opencortex--break-links (opencortex--visible text)))
         (text (replace-regexp-in-string "^\\*" " *" text t t)))
    (replace-regexp-in-string "^\\([ \t]*\\)\\(,*#\\+\\)" "\\1,\\2" text t)))

(defun opencortex--thinking-live-p (thinking)
  "Whether THINKING has a block in the live chat buffer."
  (let ((start (opencortex--thinking-start thinking)))
    (and (markerp start)
         (eq (marker-buffer start) (get-buffer opencortex-chat-buffer-name)))))

(defun opencortex--thinking-open (thinking)
  "Draw THINKING's block, empty, at the output position."
  (opencortex--fresh-line)
  (when (opencortex--stream-end-at-p (point))
    (insert (opencortex--read-only "\n")))
  (setf (opencortex--thinking-start thinking) (point-marker))
  (insert (opencortex--read-only "#+begin_thinking\n"))
  (setf (opencortex--thinking-tail thinking) (point-marker)
        (opencortex--thinking-stop thinking) (point-marker))
  (insert (opencortex--read-only "#+end_thinking\n"))
  (setf (opencortex--thinking-close thinking) (point-marker)))

(defun opencortex--thinking-write (thinking)
  "Draw the pending pieces of THINKING.
Whole lines are drawn once, the line still streaming again as it grows."
  (let* ((raw (apply #'concat (opencortex--thinking-line thinking)
                     (nreverse (opencortex--thinking-pending thinking))))
         (cut (and (string-match "\n[^\n]*\\'" raw) (1+ (match-beginning 0))))
         (lines (if cut (substring raw 0 cut) ""))
         (line (if cut (substring raw cut) raw)))
    (while (> (length line) opencortex--thinking-line-limit)
      (setq lines (concat lines (substring line 0 opencortex--thinking-line-limit) "\n")
            line (substring line opencortex--thinking-line-limit)))
    (setf (opencortex--thinking-pending thinking) nil
          (opencortex--thinking-line thinking) line)
    (opencortex--with-output
     (lambda ()
       (unless (opencortex--thinking-live-p thinking)
         (opencortex--thinking-open thinking))
       (let ((tail (opencortex--thinking-tail thinking))
             (stop (opencortex--thinking-stop thinking)))
         (goto-char tail)
         (delete-region tail stop)
         (insert (opencortex--read-only (opencortex--thinking-inert lines)))
         (set-marker tail (point))
         (unless (string-empty-p line)
           (insert (opencortex--read-only (concat (opencortex--thinking-inert line) "\n"))))
         (set-marker stop (point))
         (cl-incf opencortex--stream-updates)
         (opencortex--changed (marker-position (opencortex--thinking-start thinking))
                              (marker-position (opencortex--thinking-close thinking))))))))

(defun opencortex--thinking-end (thinking remove)
  "Fold THINKING's block, its turn done; with REMOVE delete it.
It is deleted too unless `opencortex-show-thinking' is t."
  (when (opencortex--thinking-live-p thinking)
    (let ((start (opencortex--thinking-start thinking))
          (close (opencortex--thinking-close thinking)))
      (opencortex--with-output
       (lambda ()
         (if (or remove (not (eq opencortex-show-thinking t)))
             (delete-region start close)
           (goto-char start)
           (org-hide-block-toggle t t))))
      (mapc (lambda (marker) (set-marker marker nil))
            (list start close (opencortex--thinking-tail thinking)
                  (opencortex--thinking-stop thinking))))))

(defun opencortex--on-thinking (turn-id text)
  "Queue, for the turn TURN-ID, the streamed TEXT of its model's thinking."
  (opencortex--turn-started turn-id)
  (when opencortex-show-thinking
    (let* ((known (gethash turn-id opencortex--streams))
           (stream (or known (puthash turn-id (opencortex--make-stream turn-id)
                                      opencortex--streams)))
           (thinking (or (opencortex--stream-thinking stream)
                         (setf (opencortex--stream-thinking stream)
                               (opencortex--make-thinking)))))
      (push text (opencortex--thinking-pending thinking))
      (if (opencortex--thinking-live-p thinking)
          (opencortex--schedule-flush)
        (opencortex--flush-streams)))))

(defun opencortex--schedule-flush ()
  "Write pending text now if the last update is an interval old, else later."
  (unless (timerp opencortex--flush-timer)
    (let ((wait (- (+ opencortex--last-flush opencortex-stream-interval) (float-time))))
      (if (<= wait 0)
          (opencortex--flush-streams)
        (setq opencortex--flush-timer
              (run-at-time wait nil #'opencortex--flush-streams))))))

(defun opencortex--close-stream (turn-id &optional remove)
  "Forget the streamed region of TURN-ID; with REMOVE delete its text.
REMOVE deletes its thinking too; else the thinking is folded (see
`opencortex--thinking-end').  Return the region's start position when
it was live, else nil."
  (let ((stream (gethash turn-id opencortex--streams))
        start)
    (when stream
      (remhash turn-id opencortex--streams)
      (when (opencortex--stream-thinking stream)
        (opencortex--thinking-end (opencortex--stream-thinking stream) remove))
      (when (opencortex--stream-live-p stream)
        (setq start (marker-position (opencortex--stream-start stream)))
        (when remove
          (opencortex--with-output
           (lambda ()
             (delete-region (opencortex--stream-start stream)
                            (opencortex--stream-end stream)))))
        (set-marker (opencortex--stream-start stream) nil)
        (set-marker (opencortex--stream-end stream) nil)))
    start))

(defun opencortex--on-chunk (turn-id text)
  "Queue, for the turn TURN-ID, the streamed TEXT.
A turn's first words are written at once, even when another turn's were
written a moment ago; the rest are coalesced."
  (opencortex--turn-started turn-id)
  (let* ((known (gethash turn-id opencortex--streams))
         (stream (or known (puthash turn-id (opencortex--make-stream turn-id)
                                    opencortex--streams))))
    (push text (opencortex--stream-pending stream))
    (if known
        (opencortex--schedule-flush)
      (opencortex--flush-streams))))

(defun opencortex--on-end (turn-id text)
  "End TURN-ID: its streamed region becomes TEXT (nothing when TEXT is empty)."
  (let* ((stream (gethash turn-id opencortex--streams))
         (thinking (and stream (opencortex--stream-thinking stream)))
         (live (and stream (opencortex--stream-live-p stream))))
    (when (and thinking (opencortex--thinking-pending thinking))
      (opencortex--thinking-write thinking))
    (if live
        (opencortex--with-output
         (lambda ()
           (let ((start (opencortex--stream-start stream)))
             (goto-char start)
             (insert (opencortex--read-only (opencortex--visible text)))
             (delete-region (point) (opencortex--stream-end stream))
             (unless (string-empty-p text)
               (setq opencortex--last-output-kind 'stream)
               (opencortex--changed start (point))))))
      (unless (string-empty-p text)
        (opencortex--output text nil 'stream)))
    (opencortex--close-stream turn-id)
    (opencortex--finish-turn turn-id)))

(defun opencortex--on-abort (turn-id text)
  "Abort TURN-ID: remove its streamed region and show TEXT as an error."
  (opencortex--close-stream turn-id t)
  (opencortex--show-error (if (string-empty-p text)
                              "The turn was aborted; send the message again if you still want an answer."
                            text))
  (opencortex--finish-turn turn-id))

(defun opencortex--handle-stream (turn-id kind text)
  "Method `opencortex-stream': an event of the turn TURN-ID.
KIND \"chunk\" appends the streamed TEXT, \"thinking\" the model's streamed
thinking, \"reset\" removes what was streamed (a rejected reply, or a
request asked again; a retry follows), \"end\" replaces it with the final
TEXT, \"abort\" removes it and shows TEXT as an error."
  (opencortex--check-string turn-id "turn-id")
  (opencortex--check-string text "text")
  (let ((kind (if (symbolp kind) (symbol-name kind) kind)))
    (unless (opencortex--turn-finished-p turn-id)
      (pcase kind
        ("chunk" (opencortex--on-chunk turn-id text))
        ("thinking" (opencortex--on-thinking turn-id text))
        ("reset" (opencortex--close-stream turn-id t))
        ("end" (opencortex--on-end turn-id text))
        ("abort" (opencortex--on-abort turn-id text))
        (_ (error "Unknown kind of stream event: %S" kind)))))
  t)

(defun opencortex--handle-status-changed (status)
  "Method `opencortex-status-changed': show STATUS in the header line.
The turn named by its :turn-id, if any, has ended."
  (opencortex--set-status status)
  (let ((turn-id (and (listp status) (plist-get status :turn-id))))
    (when (and (stringp turn-id) (not (opencortex--turn-finished-p turn-id)))
      (when (gethash turn-id opencortex--streams)
        (opencortex--flush-streams)
        (opencortex--close-stream turn-id))
      (remhash turn-id opencortex--turns-in-flight)
      (puthash turn-id t opencortex--finished-turns)))
  t)

(defun opencortex--abandon-turns ()
  "The kernel is gone: end every turn in flight and remove its partial text.
Return how many turns were in flight."
  (when (timerp opencortex--flush-timer)
    (cancel-timer opencortex--flush-timer))
  (setq opencortex--flush-timer nil)
  (let ((turns (hash-table-keys opencortex--turns-in-flight)))
    (dolist (turn-id (hash-table-keys opencortex--streams))
      (opencortex--close-stream turn-id t)
      (cl-pushnew turn-id turns :test #'equal))
    (dolist (turn-id turns)
      (remhash turn-id opencortex--turns-in-flight)
      (puthash turn-id t opencortex--finished-turns))
    (length turns)))

(provide 'opencortex-stream)
;;; opencortex-stream.el ends here
