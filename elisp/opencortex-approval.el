;;; opencortex-approval.el --- Approving or denying what the kernel wants to run  -*- lexical-binding: t; coding: utf-8 -*-

;; This file is part of opencortex.  License: GPL-3.0-or-later.

;;; Commentary:

;; When an action needs a person's yes (a shell command first), the kernel
;; calls `opencortex-ask-approval'.  The chat buffer then shows exactly what
;; would run (the argument vector), where and why, with [Approve] and [Deny]
;; buttons; \\[opencortex-approve] and \\[opencortex-deny] answer the latest
;; pending one.  The answer goes back with `answer-approval'.  No answer
;; within the request's :timeout is a denial: the prompt then says so (the
;; kernel denies on its own at the same time).

;;; Code:

(require 'cl-lib)
(require 'button)
(require 'subr-x)
(require 'opencortex-chat)

(defcustom opencortex-approval-default-timeout 120
  "Seconds an approval waits when the kernel names no :timeout."
  :type 'number
  :group 'opencortex)

(cl-defstruct (opencortex--approval (:constructor opencortex--make-approval (id))
                                    (:copier nil))
  "One approval request shown in the chat buffer.
START and END hold the line of buttons, replaced by the outcome."
  id start end timer)

(defvar opencortex--approvals nil
  "Approvals waiting for an answer, newest first.")

(defun opencortex-pending-approvals ()
  "Ids of the approvals waiting for an answer, newest first."
  (mapcar #'opencortex--approval-id opencortex--approvals))

(defun opencortex--org-example (text)
  "TEXT escaped for an org example block (lines starting with * or #+)."
  (replace-regexp-in-string "^\\([*]\\|#\\+\\)" ",\\1" text t))

(defun opencortex--approval-text (details)
  "Org text describing DETAILS, the plist of an approval request."
  (let ((command (plist-get details :command))
        (argv (plist-get details :argv))
        (cwd (plist-get details :cwd))
        (reason (plist-get details :reason)))
    (concat "* Approval needed: run a command\n"
            "#+begin_example\n"
            (opencortex--org-example
             (opencortex--ensure-newline
              (if (stringp command) command (mapconcat #'identity argv " "))))
            "#+end_example\n"
            (format "- argv :: %s\n" (mapconcat #'prin1-to-string argv " "))
            (if (stringp cwd) (format "- directory :: %s\n" cwd) "")
            (if (stringp reason) (format "- why :: %s\n" reason) ""))))

(defun opencortex--handle-ask-approval (approval-id details)
  "Method `opencortex-ask-approval': show request APPROVAL-ID described by DETAILS.
DETAILS is a plist (:command :argv :cwd :reason :timeout)."
  (let* ((id (if (stringp approval-id) approval-id (format "%s" approval-id)))
         (timeout (let ((given (plist-get details :timeout)))
                    (if (and (numberp given) (> given 0))
                        given
                      opencortex-approval-default-timeout)))
         (approval (opencortex--make-approval id)))
    (unless (listp (plist-get details :argv))
      (error "opencortex-ask-approval: :argv must be a list of strings"))
    (opencortex--output (opencortex--approval-text details) nil 'approval)
    (opencortex--with-output
     (lambda ()
       (let ((beg (point)))
         (insert-text-button "[Approve]" 'action (lambda (_) (opencortex-approve id))
                             'follow-link t 'help-echo "Run it")
         (insert " ")
         (insert-text-button "[Deny]" 'action (lambda (_) (opencortex-deny id))
                             'follow-link t 'help-echo "Do not run it")
         (insert (format "  C-c C-a approves, C-c C-d denies; no answer in %s s means no"
                         timeout))
         (setf (opencortex--approval-start approval) (copy-marker beg)
               (opencortex--approval-end approval) (point-marker))
         (insert "\n")
         (add-text-properties beg (point) '(read-only t front-sticky (read-only)))
         (opencortex--changed beg (point)))))
    (setf (opencortex--approval-timer approval)
          (run-at-time timeout nil #'opencortex--approval-timed-out id))
    (push approval opencortex--approvals))
  t)

(defun opencortex--show-outcome (approval outcome face)
  "Replace the buttons (or the previous outcome) of APPROVAL with OUTCOME in FACE."
  (let ((start (opencortex--approval-start approval))
        (end (opencortex--approval-end approval)))
    (when (and (markerp start) (buffer-live-p (marker-buffer start)))
      (with-current-buffer (marker-buffer start)
        (let ((inhibit-read-only t)
              (buffer-undo-list t))
          (save-excursion
            (goto-char start)
            (insert (opencortex--read-only outcome face))
            (delete-region (point) end)
            (set-marker end (point))
            (opencortex--changed start (point))))))))

(defun opencortex--settle-approval (approval outcome face)
  "APPROVAL no longer waits: cancel its timer and show OUTCOME in FACE."
  (when (timerp (opencortex--approval-timer approval))
    (cancel-timer (opencortex--approval-timer approval)))
  (setq opencortex--approvals (delq approval opencortex--approvals))
  (opencortex--show-outcome approval outcome face))

(defun opencortex--forget-approval (approval)
  "Release the markers of APPROVAL."
  (dolist (marker (list (opencortex--approval-start approval)
                        (opencortex--approval-end approval)))
    (when (markerp marker) (set-marker marker nil))))

(defun opencortex--approval-timed-out (id)
  "No answer came for approval ID in time: it is denied."
  (let ((approval (cl-find id opencortex--approvals
                           :key #'opencortex--approval-id :test #'equal)))
    (when approval
      (opencortex--settle-approval approval "=> timed out — denied" 'opencortex-error-face)
      (opencortex--forget-approval approval))))

(defun opencortex--answer (id answer)
  "Answer approval ID (the latest pending when nil) with ANSWER, \"yes\" or \"no\"."
  (let ((approval (if id
                      (cl-find id opencortex--approvals
                               :key #'opencortex--approval-id :test #'equal)
                    (car opencortex--approvals)))
        (yes (equal answer "yes")))
    (cond
     (approval
      (opencortex--settle-approval approval (if yes "=> approving…" "=> denying…") 'shadow)
      (opencortex--request
       'answer-approval (list (opencortex--approval-id approval) answer)
       (lambda (known)
         (if known
             (opencortex--show-outcome approval (if yes "=> approved" "=> denied")
                                       (if yes 'success 'opencortex-error-face))
           (opencortex--show-outcome approval "=> expired before the answer — denied"
                                     'opencortex-error-face))
         (opencortex--forget-approval approval))
       (lambda (message)
         (opencortex--show-outcome
          approval (format "=> the answer did not reach the kernel (%s) — denied" message)
          'opencortex-error-face)
         (opencortex--forget-approval approval))))
     (id (message "opencortex: approval %s no longer waits for an answer" id))
     (t (user-error "No approval is waiting for an answer")))))

(defun opencortex-approve (&optional id)
  "Approve request ID, by default the latest one waiting."
  (interactive)
  (opencortex--answer id "yes"))

(defun opencortex-deny (&optional id)
  "Deny request ID, by default the latest one waiting."
  (interactive)
  (opencortex--answer id "no"))

(defun opencortex--abandon-approvals ()
  "The kernel is gone: no approval waits any more."
  (dolist (approval opencortex--approvals)
    (opencortex--settle-approval approval "=> the kernel stopped — denied"
                                 'opencortex-error-face)
    (opencortex--forget-approval approval)))

(provide 'opencortex-approval)
;;; opencortex-approval.el ends here
